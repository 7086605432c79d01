"""distlab.grading.similarity: copies are flagged through renaming, reformatting and removed
comments, wherever they sit in a cell and by their code objects; the course's own solution handed
in is flagged above a size floor; dynamic code is listed with its line, however a builtin is
reached; honest answers, short formulas and untouched cells are not flagged."""
from __future__ import annotations

import csv
import inspect
import textwrap

import pytest

import submissions
from distlab import paths
from distlab.grading import similarity
from distlab.grading.similarity import (MIN_TOKENS, References, compare_cell, fingerprints,
                                        normalise, threshold)
from distlab.grading.similarity_code import code_keys, definitions
from distlab.grading.similarity_course import course_cells, course_code, course_implementations
from distlab.grading.similarity_dynamic import dynamic_uses
from distlab.grading.similarity_solution import SOLUTION_FLOOR
from distlab.grading.similarity_text import K, definition_fingerprints
from distlab.labs.collectives import reference_fit
from submissions import attacks, copies

RING = '''
def ring_all_reduce(tensor):
    """Sum over ranks by a ring."""
    n, r = dist.get_world_size(), dist.get_rank()
    out = tensor.reshape(-1).clone()                            # (N,)
    chunks = list(torch.tensor_split(out, n))
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):                                   # reduce-scatter
        send_c, recv_c = (r - step) % n, (r - step - 1) % n
        incoming = torch.empty_like(chunks[recv_c])
        work = dist.isend(chunks[send_c].contiguous(), right)
        dist.recv(incoming, left)
        work.wait()
        chunks[recv_c] += incoming
    for step in range(n - 1):                                   # all-gather
        send_c, recv_c = (r + 1 - step) % n, (r - step) % n
        incoming = torch.empty_like(chunks[recv_c])
        work = dist.isend(chunks[send_c].contiguous(), right)
        dist.recv(incoming, left)
        work.wait()
        chunks[recv_c].copy_(incoming)
    return out.reshape(tensor.shape)
'''

# The same code as another student would disguise it: new names, no comments, other layout.
RING_DISGUISED = '''
def ring_all_reduce(t):
    size, me = (dist.get_world_size(),
                dist.get_rank())
    flat = t.reshape(-1).clone()
    pieces = list(torch.tensor_split(flat, size))
    nxt, prv = (me + 1) % size, (me - 1) % size
    for i in range(size - 1):
        a, b = (me - i) % size, (me - i - 1) % size
        buf = torch.empty_like(pieces[b])
        req = dist.isend(pieces[a].contiguous(), nxt)
        dist.recv(buf, prv)
        req.wait()
        pieces[b] += buf
    for i in range(size - 1):
        a, b = (me + 1 - i) % size, (me - i) % size
        buf = torch.empty_like(pieces[b])
        req = dist.isend(pieces[a].contiguous(), nxt)
        dist.recv(buf, prv)
        req.wait()
        pieces[b].copy_(buf)
    return flat.reshape(t.shape)
'''

# An honest, different answer to the same exercise: whole-tensor passes around the ring (the
# copy report's honest sample, tests/submissions/copies.py).
RING_OTHER = copies.OTHER_RING.split("\n\n\ndef ")[0] + "\n"

HANDED_OUT = '''
def ring_all_reduce(tensor):
    """Sum over ranks by a ring."""
    raise NotImplementedError("your code here")
'''


def test_renaming_layout_and_comments_change_nothing():
    assert normalise(RING) == normalise(RING_DISGUISED)
    assert normalise(RING) != normalise(RING_OTHER)


def test_a_copy_of_a_shipped_implementation_is_flagged():
    source = inspect.getsource(reference_fit)
    disguised = textwrap.dedent(source).replace("sizes", "xs").replace("times", "ys") \
        .replace("alpha", "a0").replace("inv_bandwidth", "ib")
    disguised = "\n".join(line.split("#")[0].rstrip() for line in disguised.splitlines())
    flags = compare_cell("01_collectives", "alpha_beta", {"eve": disguised, "ann": RING_OTHER},
                         [HANDED_OUT], {"distlab.labs.collectives:reference_fit": source})
    assert [(f.student, f.kind) for f in flags] == [("eve", "course implementation"),
                                                    ("eve", "bytecode")]


def test_students_copying_each_other_are_flagged():
    flags = compare_cell("01_collectives", "ring_all_reduce",
                         {"ann": RING, "bob": RING_DISGUISED, "cat": RING_OTHER,
                          "dan": HANDED_OUT}, [HANDED_OUT], {})
    assert [(f.student, f.other, f.kind) for f in flags] == [("ann", "bob", "another student")]
    assert flags[0].similarity == 1.0


def test_what_everyone_shares_with_the_course_solution_is_common_ground():
    # Both handed in the course's own solution: each is flagged as that, not as a copy of the
    # other (what they share is the course's).
    flags = compare_cell("01_collectives", "ring_all_reduce", {"ann": RING, "bob": RING},
                         [HANDED_OUT, RING], {})
    assert [(f.student, f.kind, f.other) for f in flags] == \
        [("ann", "course solution", "course: solution"), ("bob", "course solution",
                                                         "course: solution")]



def _flags(answers, base, references=None):
    return [(f.student, f.kind, f.other, f.detail)
            for f in compare_cell("01_collectives", "ring_all_reduce", answers, base,
                                  references or {})]


def _padded(source: str) -> str:
    """``source`` with a no-op string statement before every line of its body."""
    lines = source.strip("\n").splitlines()
    body = [f'{line[:len(line) - len(line.lstrip())]}"pad"\n{line}' for line in lines[1:]]
    return "\n".join(lines[:1] + body) + "\n"


def test_the_course_solution_handed_in_is_flagged_however_disguised():
    base = [HANDED_OUT, RING]
    solution = [("eve", "course solution", "course: solution", "the whole cell")]
    assert _flags({"eve": RING}, base) == solution
    assert _flags({"eve": RING_DISGUISED}, base) == solution        # renamed, no comments
    # after a definition of its own: the definition is found
    assert _flags({"eve": PREDICT + "\n" + RING_DISGUISED}, base) == \
        [("eve", "course solution", "course: solution", "line 5: ring_all_reduce")]
    # no-op lines between its own: the code object is the solution's
    padded = _padded(copies.disguise(RING, {"ring_all_reduce": "ring_all_reduce"}))
    assert _flags({"eve": padded}, base) == \
        [("eve", "course solution", "course: solution", "line 1: ring_all_reduce (bytecode)")]
    # an answer of one's own, the handed-out cell, and one changed line are not the solution
    changed = RING.replace("work.wait()\n        chunks[recv_c] +=", "work.wait()\n"
                           "        chunks[recv_c] = chunks[recv_c] +")
    assert _flags({"cat": RING_OTHER, "dan": HANDED_OUT, "fay": changed}, base) == []


def test_a_copy_of_an_implementation_that_the_solution_contains_is_flagged():
    # The course ships a ring much like its solution's (one line differs): the solution holds
    # nearly all of it, so the comparison with the package takes it for common ground.
    line = "dist.recv(incoming, left)\n        work.wait()\n        chunks[recv_c] +="
    shipped = RING.replace(line, "dist.irecv(incoming, left).wait()\n        work.wait()\n"
                           "        chunks[recv_c] +=")
    assert shipped != RING
    references = {"distlab.labs.collectives:ring": shipped}
    copy = copies.disguise(shipped, {"ring_all_reduce": "ring_all_reduce"})
    # (its code object differs from the solution's: the bytecode comparison finds it too)
    assert _flags({"eve": copy}, [HANDED_OUT, RING], references) == \
        [("eve", "course solution", "course: distlab.labs.collectives:ring", "the whole cell"),
         ("eve", "bytecode", "course: distlab.labs.collectives:ring", "line 1: ring_all_reduce")]
    # without the solution as common ground, the package's copy is found as before
    assert ("eve", "course implementation", "course: distlab.labs.collectives:ring",
            "line 1: ring_all_reduce") in _flags({"eve": copy}, [HANDED_OUT], references)


def test_short_answers_are_not_compared_and_short_cells_need_more():
    formula = "def busbw(algbw, n):\n    return algbw * 2 * (n - 1) / n\n"
    assert len(normalise(formula)) < MIN_TOKENS
    assert compare_cell("01_collectives", "bandwidths", {"a": formula, "b": formula},
                        [HANDED_OUT], {}) == []
    assert threshold(MIN_TOKENS) > threshold(100) > threshold(1000) == 0.8


FIT = "distlab.labs.collectives:reference_fit"
FIT_HANDED_OUT = "def fit_alpha_beta(sizes, times):\n    raise NotImplementedError\n"
PREDICT = "def predict_time(alpha, bandwidth, nbytes):\n    return alpha + nbytes / bandwidth\n"


def _copied_fit() -> str:
    return copies.disguise(inspect.getsource(reference_fit), {"reference_fit": "fit_alpha_beta"})


def test_a_renamed_copy_after_another_definition_is_flagged():
    # predict_time binds four names first: numbered over the whole cell, every name of the copy
    # shifts and no fingerprint of the course's function is left in the cell's.
    cell = "import math\n\n" + PREDICT + "\n\n" + _copied_fit()
    references = References({FIT: inspect.getsource(reference_fit)})
    common = fingerprints(FIT_HANDED_OUT)[1]
    assert references.copied(fingerprints(cell)[1] - common, common) == []
    flags = compare_cell("01_collectives", "alpha_beta", {"eve": cell}, [FIT_HANDED_OUT],
                         references)
    text = [f for f in flags if f.kind == "course implementation"]
    assert [(f.student, f.other, f.detail) for f in text] == \
        [("eve", f"course: {FIT}", "line 7: fit_alpha_beta")]
    assert text[0].similarity == 1.0


def test_a_copy_with_the_course_code_objects_is_flagged_by_bytecode():
    # Every name changed, no docstring, no comment, and a no-op statement between every two
    # lines: the text comparison loses it, the compiled functions stay the course's.
    lines = _copied_fit().splitlines()
    padded = "\n\n".join(lines[:2] + [f'    "step {i}"\n{line}' for i, line in
                                       enumerate(lines[2:])]) + "\n"
    assert code_keys(padded).keys() == code_keys(inspect.getsource(reference_fit)).keys()
    flags = compare_cell("01_collectives", "alpha_beta", {"eve": PREDICT + "\n" + padded},
                         [FIT_HANDED_OUT], {FIT: inspect.getsource(reference_fit)})
    assert [(f.kind, f.other, f.similarity, f.detail) for f in flags] == \
        [("bytecode", f"course: {FIT}", 1.0, "line 4: fit_alpha_beta")]
    # another constant is other code
    changed = padded.replace("1 /", "2 /")
    assert compare_cell("01_collectives", "alpha_beta", {"eve": changed}, [FIT_HANDED_OUT],
                        {FIT: inspect.getsource(reference_fit)}) == []


LOOP = """
def f(xs, n):
    total = 0
    for x in xs:
        if x > n:
            total += x * 2
        else:
            total -= 1
    while total > 100:
        total //= 2
    return [t + 1 for t in range(total)], total * 3 + n
"""

# LOOP with every name changed, lines moved, and statements that compile to nothing (or to a
# no-op, which moves every jump) put between its own.
LOOP_PADDED = """
def g(items, limit):
    acc = 0
    "pad"
    for it in items:
        pass
        if it > limit:
            "pad"
            acc += it * 2
        else:
            pass
            acc -= 1
    while acc > 100:
        pass
        acc //= 2
    return [q + 1 for q in range(acc)], acc * 3 + limit
"""


def test_code_keys_leave_out_names_lines_and_no_ops():
    (key, (line, name, _)), = code_keys(LOOP).items()
    assert (line, name) == (2, "f")
    assert code_keys(LOOP_PADDED).keys() == {key}
    for changed in ("acc * 3", "acc * 4"), ("acc > 100", "acc >= 100"), ("acc -= 1", "pass"):
        assert code_keys(LOOP_PADDED.replace(*changed)).keys() != {key}, changed


ROUTES = {
    "exec of the source": ("x = 1\nimport inspect\nexec(inspect.getsource(reference_fit))\n",
                           "line 2: import inspect; line 3: exec(...); line 3: inspect.getsource"),
    "an eval'd lambda": ("x = 1\nfit_alpha_beta = eval('lambda s, t: reference_fit(s, t)')\n",
                         "line 2: eval(...)"),
    "the profile hook off": ("import sys\n\nsys.setprofile(None)\n", "line 3: sys.setprofile"),
    "a code object copied": ("def fit_alpha_beta(s, t):\n    pass\n\nfit_alpha_beta.__code__ = "
                             "reference_fit.__code__.replace(co_name='fit')\n",
                             "line 4: .__code__"),
    "a function built": ("import types\nfit_alpha_beta = types.FunctionType(code, {})\n",
                         "line 2: types.FunctionType"),
    "importlib": ("import importlib\nm = importlib.import_module('distlab.labs.collectives')\n",
                  "line 1: import importlib; line 2: importlib.import_module"),
    "the module's file": ("from distlab.labs import collectives\n"
                          "text = open(collectives.__file__).read()\n", "line 2: .__file__"),
    "a .py path": ("text = open('distlab/labs/collectives.py').read()\n", "line 1: a .py path"),
    "a magic": ("x = 1\n%load distlab/labs/collectives.py\n", "line 2: magic %load"),
    # builtins reached without their names, or behind names of the cell's own
    "exec by a builtin's module": ("print.__self__.exec(text)\n",
                                   "line 1: .__self__; line 1: exec(...) via print.__self__"),
    "exec by vars(builtins)": ("import builtins\nvars(builtins)['exec'](text)\n",
                               "line 1: import builtins; line 2: 'exec'; "
                               "line 2: exec(...) via vars(builtins)"),
    "a computed name in the builtins' dict": (
        "b = len.__self__\nb.__dict__['ev' + 'al'](text)\n",
        "line 1: .__self__; line 2: a name looked up in b.__dict__; "
        "line 2: b (bound to the builtins, via len.__self__)"),
    "getattr on __builtins__": ("getattr(__builtins__, 'exec')(text)\n",
                                "line 1: 'exec'; line 1: __builtins__; "
                                "line 1: exec(...) via __builtins__"),
    "__builtins__[...]": ("__builtins__['eval'](text)\n",
                          "line 1: 'eval'; line 1: __builtins__; "
                          "line 1: eval(...) via __builtins__"),
    "exec bound elsewhere in the cell": ("exec = print\nexec(text)\n", "line 2: exec(...)"),
    "exec under another name": ("run = exec\nrun(text)\n",
                                "line 1: exec; line 2: run (bound to exec)"),
    "getattr of a builtin's module, bound": (
        "run = getattr(print.__self__, 'exec')\nrun(text)\n",
        "line 1: 'exec'; line 1: .__self__; line 1: exec via print.__self__; "
        "line 2: run (bound to exec via print.__self__)"),
    # frames, unpickling, other processes, functions made by hand
    "a frame walk": ("try:\n    raise ValueError\nexcept ValueError as e:\n"
                     "    up = e.__traceback__.tb_frame.f_back.f_locals\n",
                     "line 4: .__traceback__; line 4: .f_back; line 4: .f_locals; "
                     "line 4: .tb_frame"),
    "a frame by name": ("frame = getattr(tb, 'tb_frame')\nx = frame.f_globals\n",
                        "line 1: 'tb_frame'; line 2: .f_globals; "
                        "line 2: frame (bound to 'tb_frame')"),
    "a generator's frame": ("g = (i for i in [1])\nup = g.gi_frame.f_back\nup.f_locals\n",
                            "line 2: .f_back; line 2: .gi_frame; line 3: .f_locals; "
                            "line 3: up (bound to .f_back)"),
    "pickle.loads": ("import pickle\nf = pickle.loads(blob)\n",
                     "line 1: import pickle; line 2: pickle.loads"),
    "marshal.loads": ("from marshal import loads\ncode = loads(blob)\n",
                      "line 1: from marshal import loads; line 2: marshal.loads"),
    "runpy": ("import runpy\nrunpy.run_path('x')\n",
              "line 1: import runpy; line 2: runpy.run_path"),
    "a function's type": ("make = type(lambda: 0)\nf = make(code, {})\n",
                          "line 1: type(a function); line 2: make (bound to type(a function))"),
    "a def's type": ("def g():\n    pass\n\nh = type(g)(g.__code__, {})\n",
                     "line 4: .__code__; line 4: type(a function)"),
    "os.system by getattr": ("import os\ngetattr(os, 'system')('ls')\n", "line 2: 'system'"),
    "object.__getattribute__": ("object.__getattribute__(module, 'ref')\n",
                                "line 1: .__getattribute__"),
    "object.__setattr__": ("object.__setattr__(module, 'check', None)\n",
                           "line 1: object.__setattr__"),
    "subprocess": ("import subprocess\nsubprocess.run(['cat', 'x'])\n",
                   "line 1: import subprocess; line 2: subprocess.run"),
    "os.system and os.exec*": ("import os\nos.system('ls')\nos.execvp('ls', ['ls'])\n",
                               "line 2: os.system; line 3: os.execvp"),
    "ctypes": ("import ctypes\n", "line 1: import ctypes"),
    "multiprocessing": ("import torch.multiprocessing as mp\n",
                        "line 1: import torch.multiprocessing"),
    "socket": ("from socket import socket\ns = socket()\n",
               "line 1: from socket import socket; line 2: socket.socket"),
}


@pytest.mark.parametrize("route", ROUTES)
def test_dynamic_code_and_introspection_are_listed_with_their_line(route):
    code, detail = ROUTES[route]
    flags = compare_cell("01_collectives", "alpha_beta", {"eve": code}, [FIT_HANDED_OUT], {})
    assert [(f.student, f.kind, f.detail) for f in flags] == [("eve", "dynamic", detail)]


def test_what_the_handed_out_cell_uses_is_not_listed():
    code = "import inspect\nprint(inspect.getsource(f))\n"
    assert compare_cell("01_collectives", "x", {"eve": code}, [code], {}) == []
    # model.eval(), torch.compile and a string "eval" are not the builtins; a function of one's
    # own named exec, a parameter named eval, a variable named code, os.path, os._exit and
    # nn.Module's __setattr__ through super() are one's own
    honest = ("model.eval()\nfast = torch.compile(model)\nmode = 'eval'\n"
              "def exec(x):\n    return x\nexec(1)\n"
              "def train(model, eval=False):\n    return model if eval else None\n"
              "code = 3\nbits = code.bit_length()\nimport os\nos.path.join('a', 'b')\n"
              "kinds = {'system': 1, 'exception': 2}\nkinds['system'] += kinds['exception']\n"
              "class M(torch.nn.Module):\n    def __init__(self):\n"
              "        super().__setattr__('x', 1)\n        os._exit(3)\n")
    assert compare_cell("01_collectives", "x", {"eve": honest}, [FIT_HANDED_OUT], {}) == []
    # a parameter named exec, called, is listed
    assert dynamic_uses("def f(exec):\n    exec(text)\n") == [(2, "exec(...)")]


@pytest.fixture(scope="module")
def course_references():
    return References(course_implementations(), course_code())


def test_the_kept_course_side_is_the_one_computed_now(course_references):
    # References.course() reads the course side from the user's cache folder when a run made it
    # before (similarity_cache.py; tests/test_similarity_cache.py changes the sources): whether
    # read or computed, it is what the course's files give now.
    kept = References.course()
    assert kept.sources == course_references.sources and kept.code == course_references.code
    assert kept.prints == course_references.prints
    assert {fp: sorted(names) for fp, names in kept.index.items()} == \
        {fp: sorted(names) for fp, names in course_references.index.items()}


def _beyond_handed_out(base: list[str]) -> int:
    ground = fingerprints(base[0])[1] | definition_fingerprints(base[0])
    return len(fingerprints(base[1])[1] - ground) + K - 1


def test_the_course_solutions_are_flagged_as_such_above_the_floor(course_references):
    # Every lab's solution cell handed in as it is and disguised: flagged as the course's
    # solution, and as nothing else, where it is long enough to tell (SOLUTION_FLOOR tokens
    # beyond the handed-out cell); the cell left as handed out is not flagged. No solution needs
    # dynamic code, even without the common ground.
    sizes = {}
    for lab in paths.labs():
        for gid, base in course_cells(lab).items():
            assert dynamic_uses(base[1]) == [] and dynamic_uses(base[0]) == [], (lab, gid)
            names = {name: name for _, name, _ in definitions(base[1]) if "." not in name}
            answers = {"solution": base[1], "untouched": base[0],
                       "disguised": copies.disguise(base[1], names)}
            flags = compare_cell(lab, gid, answers, base, course_references)
            sizes[lab, gid] = _beyond_handed_out(base)
            expected = [("disguised", "course solution", "the whole cell"),
                        ("solution", "course solution", "the whole cell")]
            assert [(f.student, f.kind, f.detail) for f in flags] == \
                (expected if sizes[lab, gid] >= SOLUTION_FLOOR else []), (lab, gid, flags)
    # the floor leaves the formulas out and the algorithms in
    assert sizes["01_collectives", "bandwidths"] < SOLUTION_FLOOR
    assert sizes["02_data_parallel", "predict_state_bytes"] < SOLUTION_FLOOR
    assert sizes["01_collectives", "all_reduce_rs_ag"] >= SOLUTION_FLOOR
    assert sizes["01_collectives", "ring_all_reduce"] >= SOLUTION_FLOOR
    assert sum(size >= SOLUTION_FLOOR for size in sizes.values()) > len(sizes) / 2


# ---------------------------------------------------------------------------------------------
# The report over the test suite's own sample submissions (read from their notebooks: the report
# needs no grading run)

@pytest.fixture(scope="module")
def suite_report(tmp_path_factory):
    """The report over every sample the grading tests grade, plus the copies; (flags, found)."""
    folder = tmp_path_factory.mktemp("similarity") / "submitted"
    found: dict[str, list[str]] = {}

    def add(nb, student, lab):
        submissions.write(nb, folder, student, lab)
        found.setdefault(student, []).append(lab)

    for lab in paths.labs():
        add(submissions.solved(lab), "solution", lab)
        add(submissions.student(lab), "untouched", lab)
    for (student, lab), (nb, _) in submissions.special_samples().items():
        add(nb, student, lab)
    for student, (nb, _) in attacks.attack_samples().items():
        add(nb, student, attacks.LAB)
    for (student, lab), nb in copies.copy_samples().items():
        add(nb, student, lab)
    return similarity.report(folder, found), found, folder


def test_the_copies_among_the_suite_samples_are_flagged_and_nothing_else(suite_report):
    flags, found, _ = suite_report
    copied = [f for f in flags if f.kind in similarity.COPY_KINDS]
    assert {(f.student, f.cell, f.other) for f in copied} == copies.expected_flags(), \
        "\n".join(map(str, flags))
    # the copy after another definition, found by its text and by its code object
    assert {f.kind for f in copied if f.student == "moe_copier"} == \
        {"course implementation", "bytecode"}
    for flag in copied:
        if flag.kind != "bytecode":
            assert flag.similarity >= threshold(flag.tokens) and flag.tokens >= MIN_TOKENS
    copiers = {student for student, _ in copies.copy_samples()}
    honest = set(found) - copiers
    assert len(honest) >= 20      # solution, untouched, partial, mistakes, attacks
    assert not {f.student for f in copied} & honest and not {f.other for f in copied} & honest


def test_only_the_samples_that_run_code_from_text_are_listed_as_dynamic(suite_report):
    flags, found, _ = suite_report
    dynamic = {(f.student, f.cell): f.detail for f in flags if f.kind == "dynamic"}
    copiers = {student for student, _ in copies.copy_samples()}
    assert {k: v for k, v in dynamic.items() if k[0] in copiers} == copies.EXPECTED_DYNAMIC
    # the attack that execs the course's solution out of its own notebook file is listed too
    assert "exec(...)" in dynamic[("copies_solution", "all_reduce_rs_ag")]
    attackers = set(attacks.attack_samples())
    assert {student for student, _ in dynamic} <= attackers | {"source_runner", "alias_runner"}, \
        dynamic


def test_the_suite_samples_that_hand_in_the_course_solution_are_flagged_as_such(suite_report):
    # Most samples are the course's solution with one thing changed: each solution cell they
    # hand in unchanged, long enough to tell, is flagged as the course's solution, and every
    # such flag is on code that is the solution's, verbatim or disguised by a copier.
    flags, found, folder = suite_report
    solutions = {lab: {gid: base[1] for gid, base in course_cells(lab).items()
                       if _beyond_handed_out(base) >= SOLUTION_FLOOR} for lab in paths.labs()}
    handed = {(student, lab, gid): code for lab in paths.labs()
              for gid, answers in similarity.read_answers(folder, found, lab,
                                                          list(solutions[lab])).items()
              for student, code in answers.items()}
    verbatim = {key for key, code in handed.items()
                if code.strip() == solutions[key[1]][key[2]].strip()}
    flagged = [f for f in flags if f.kind == "course solution"]
    disguised = copies.expected_solution_flags()
    assert {(f.student, f.lab, f.cell) for f in flagged if f.detail == "the whole cell"
            and (f.student, f.cell, f.detail) not in disguised} == verbatim
    assert {("solution", "01_collectives", gid) for gid in solutions["01_collectives"]} <= verbatim
    assert len({student for student, *_ in verbatim}) >= 10
    assert {(f.student, f.cell, f.detail) for f in flagged} >= disguised
    for f in flagged:
        if (f.student, f.cell, f.detail) in disguised:
            continue
        code = handed[f.student, f.lab, f.cell]
        if f.detail != "the whole cell":     # a definition of the solution, among other code
            line = int(f.detail.split(":")[0].removeprefix("line "))
            text = next(t for n, _, t in definitions(code) if n == line)
            assert text.strip() in solutions[f.lab][f.cell], f
    # the answers written by hand are not the course's: the broken ones, the two who share a
    # ring, the honest rewrite (which raises no flag at all)
    own = {("hang", "all_reduce_rs_ag"), ("crash", "ring_all_reduce"), ("ann", "ring_all_reduce"),
           ("ben", "ring_all_reduce"), ("deadlock", "one_f_one_b_step"),
           ("missing_average", "data_parallel_step"), ("wrong_bucket", "bucketed_all_reduce"),
           ("rewriter", "ring_all_reduce"), ("rewriter", "all_reduce_rs_ag")}
    assert not {(f.student, f.cell) for f in flagged} & own
    assert [f for f in flags if f.student == "rewriter" or f.other == "rewriter"] == []


def test_the_report_reads_a_submissions_folder_and_writes_the_csv(tmp_path, capsys):
    folder = tmp_path / "submitted"
    for (student, lab), nb in copies.copy_samples().items():
        submissions.write(nb, folder, student, lab)
    code = similarity.main([str(folder), "--workdir", str(tmp_path / "grading")])
    assert code == 0
    with open(tmp_path / "grading" / "similarity.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == similarity.FIELDS      # the old columns first, then the detail
    assert {(r["student"], r["cell"], r["other"]) for r in rows
            if r["kind"] in similarity.COPY_KINDS} == copies.expected_flags()
    solution = {(r["student"], r["cell"], r["detail"]): r["lab"] for r in rows
                if r["kind"] == "course solution"}
    assert set(solution) >= copies.expected_solution_flags()
    assert {(r["student"], r["cell"]): r["detail"] for r in rows if r["kind"] == "dynamic"} == \
        copies.EXPECTED_DYNAMIC
    out = capsys.readouterr().out
    answers = {(lab, cell, student) for (student, cell, _), lab in solution.items()}
    students = len({student for *_, student in answers})
    assert "3 answers look copied (2 from the course's implementations), involving 4 students; " \
           f"{len(answers)} answers are the course's own solution ({students} students); " \
           "dynamic code or introspection in 2 answers (2 students)" in out, out
    assert "scores are unchanged" in out and "source_runner uses line 1: import inspect" in out


def test_the_end_of_grading_names_the_course_solution_and_not_the_rewrite(tmp_path, capsys):
    # What `distlab grade` prints and writes after grading: the course's solution handed in is
    # flagged, the honest rewrite of Lab 1 is not.
    folder, lab = tmp_path / "submitted", "01_collectives"
    submissions.write(submissions.solved(lab), folder, "alice", lab)
    submissions.write(copies.rewritten(), folder, "rewriter", lab)
    found = {"alice": [lab], "rewriter": [lab]}
    assert similarity.after_grading(folder, found, tmp_path, 0) == 0
    with open(tmp_path / "similarity.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["student"] for r in rows} == {"alice"} and \
        {r["kind"] for r in rows} == {"course solution"}
    assert {"ring_all_reduce", "all_reduce_rs_ag"} <= {r["cell"] for r in rows}
    out = capsys.readouterr().out
    assert f"{len(rows)} answers are the course's own solution (1 student)" in out, out
    assert "alice hands in solution (the whole cell" in out, out


def test_after_grading_keeps_the_exit_code_and_survives_its_own_failure(tmp_path, capsys):
    # A folder that is not there: the report fails, grading's exit code stands, a warning says so.
    assert similarity.after_grading(tmp_path / "missing", {"x": ["no_such_lab"]}, tmp_path, 0) == 0
    assert "the similarity report failed" in capsys.readouterr().err
    assert not (tmp_path / "similarity.csv").exists()
    assert similarity.after_grading(tmp_path, {}, tmp_path, 130) == 130   # interrupted: no report
    assert not (tmp_path / "similarity.csv").exists()


def test_a_report_made_during_grading_is_the_one_made_after(tmp_path, capsys):
    # `distlab grade` starts the report on a thread once a core is free (grade_run's tail): the
    # same file and lines as a report made after grading, and a failure in the thread is the
    # same warning.
    folder, lab = tmp_path / "submitted", "01_collectives"
    submissions.write(submissions.solved(lab), folder, "alice", lab)
    submissions.write(copies.rewritten(), folder, "rewriter", lab)
    found = {"alice": [lab], "rewriter": [lab]}
    outputs = []
    for started in (False, True):
        workdir = tmp_path / f"started-{started}"
        making = similarity.Making(folder, found, workdir)
        if started:
            making.start()
        assert similarity.after_grading(folder, found, workdir, 0, making) == 0
        outputs.append(((workdir / "similarity.csv").read_text(),
                        capsys.readouterr().out.replace(str(workdir), "WORKDIR")))
    assert outputs[0] == outputs[1] and "alice hands in solution" in outputs[0][1]
    failing = similarity.Making(tmp_path / "missing", {"x": ["no_such_lab"]}, tmp_path)
    failing.start()
    assert similarity.after_grading(tmp_path / "missing", {"x": ["no_such_lab"]}, tmp_path, 0,
                                    failing) == 0
    assert "the similarity report failed" in capsys.readouterr().err
