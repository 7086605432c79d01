"""distlab.grading.similarity: copies are flagged through renaming, reformatting and removed
comments; honest answers, short formulas and untouched cells are not."""
from __future__ import annotations

import csv
import inspect
import textwrap

import pytest

import submissions
from distlab import paths
from distlab.grading import similarity
from distlab.grading.similarity import MIN_TOKENS, compare_cell, normalise, threshold
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

# An honest, different answer to the same exercise: whole-tensor passes around the ring.
RING_OTHER = '''
def ring_all_reduce(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    total = tensor.clone()
    message = tensor.clone()
    for _ in range(world - 1):
        received = torch.zeros_like(message)
        if rank % 2 == 0:
            dist.send(message, (rank + 1) % world)
            dist.recv(received, (rank - 1) % world)
        else:
            dist.recv(received, (rank - 1) % world)
            dist.send(message, (rank + 1) % world)
        total += received
        message = received
    return total
'''

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
    assert [(f.student, f.kind) for f in flags] == [("eve", "course implementation")]


def test_students_copying_each_other_are_flagged():
    flags = compare_cell("01_collectives", "ring_all_reduce",
                         {"ann": RING, "bob": RING_DISGUISED, "cat": RING_OTHER,
                          "dan": HANDED_OUT}, [HANDED_OUT], {})
    assert [(f.student, f.other, f.kind) for f in flags] == [("ann", "bob", "another student")]
    assert flags[0].similarity == 1.0


def test_what_everyone_shares_with_the_course_solution_is_common_ground():
    # Both wrote the course's own solution: common ground, not copying from each other.
    flags = compare_cell("01_collectives", "ring_all_reduce", {"ann": RING, "bob": RING},
                         [HANDED_OUT, RING], {})
    assert flags == []


def test_short_answers_are_not_compared_and_short_cells_need_more():
    formula = "def busbw(algbw, n):\n    return algbw * 2 * (n - 1) / n\n"
    assert len(normalise(formula)) < MIN_TOKENS
    assert compare_cell("01_collectives", "bandwidths", {"a": formula, "b": formula},
                        [HANDED_OUT], {}) == []
    assert threshold(MIN_TOKENS) > threshold(100) > threshold(1000) == 0.8


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
    for student, nb in copies.copy_samples().items():
        add(nb, student, copies.LAB)
    return similarity.report(folder, found), found


def test_the_copies_among_the_suite_samples_are_flagged_and_nothing_else(suite_report):
    flags, found = suite_report
    assert {(f.student, f.cell, f.other) for f in flags} == copies.EXPECTED_FLAGS, \
        "\n".join(map(str, flags))
    for flag in flags:
        assert flag.similarity >= threshold(flag.tokens) and flag.tokens >= MIN_TOKENS
    honest = set(found) - {"course_copier", "ann", "ben"}
    assert len(honest) >= 20      # solution, untouched, partial, mistakes, attacks
    assert not {f.student for f in flags} & honest and not {f.other for f in flags} & honest


def test_the_report_reads_a_submissions_folder_and_writes_the_csv(tmp_path, capsys):
    folder = tmp_path / "submitted"
    for student, nb in copies.copy_samples().items():
        submissions.write(nb, folder, student, copies.LAB)
    code = similarity.main([str(folder), "--workdir", str(tmp_path / "grading")])
    assert code == 0
    with open(tmp_path / "grading" / "similarity.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["student"], r["cell"], r["other"]) for r in rows} == copies.EXPECTED_FLAGS
    out = capsys.readouterr().out
    assert "2 answers look copied (1 from the course's implementations), involving 3 students" \
        in out and "scores are unchanged" in out


def test_after_grading_keeps_the_exit_code_and_survives_its_own_failure(tmp_path, capsys):
    # A folder that is not there: the report fails, grading's exit code stands, a warning says so.
    assert similarity.after_grading(tmp_path / "missing", {"x": ["no_such_lab"]}, tmp_path, 0) == 0
    assert "the similarity report failed" in capsys.readouterr().err
    assert not (tmp_path / "similarity.csv").exists()
    assert similarity.after_grading(tmp_path, {}, tmp_path, 130) == 130   # interrupted: no report
    assert not (tmp_path / "similarity.csv").exists()
