"""Every command README.md shows, run exactly as written, in a copy of the course.

The commands are read from README.md's ```bash blocks (comments dropped), so a command that
changes there fails here until the scenario below that runs it changes with it, and a command
added there fails `test_every_readme_command_is_run` until a scenario runs it. `make test` is
the one exception: it runs this suite, and CI runs it (`.ci/run`).

They run in one copy of the course for the whole session (tests/conftest.py's ``course``, made by
tests/course_copy.py), so that what they write never touches the checkout. `make site` is run
by the ``course_site`` fixture, whose site tests/test_site.py and tests/test_browser.py also
read; `make release` by ``course_release``, whose handout tests/test_release.py also reads.
The Slurm scenario starts a real one-node cluster (tests/slurm_cluster.py); the cluster scenario
("On a cluster") a real two-node one on this host, two slurmd daemons.
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import slurm_cluster
import submissions
import test_release
import test_site
from course_copy import MAKE_REFERENCES, MAKE_RELEASE, MAKE_SITE, environ, sh
from conftest import SITE_TIMEOUT

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
LAB1 = "01_collectives"
pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------------------------
# The README's commands

def readme_commands(text: str | None = None) -> list[str]:
    """Each command line of the README's ```bash blocks, in order, comments removed."""
    text = README.read_text() if text is None else text
    commands = []
    for indent, body in re.findall(r"^( *)```bash\n(.*?)^\1```", text, re.M | re.S):
        for line in body.splitlines():
            line = re.sub(r"\s+#.*$", "", line.strip())
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def readme_python_example() -> str:
    """The README's ```python block: the `distlab.run` example that `demo.py` saves."""
    return re.search(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S).group(1)


# Each scenario runs these README commands, in this order.
SETUP = ["make lab", "make doctor", ".venv/bin/torchrun --standalone --nproc-per-node=4 demo.py"]
SITE = [MAKE_SITE, "python3 -m http.server -d build/site",
        'make site SITE_ARGS="--version student"',
        f".venv/bin/distlab site {test_site.ONE_LAB}"]
RELEASE = [MAKE_RELEASE, ".venv/bin/distlab release build/week03 --lab 03_tensor_parallel_mlp"]
GRADING = ["make setup && .venv/bin/distlab grade submitted --jobs 2"]
SLURM = ["mkdir -p logs",
         "jid=$(sbatch --parsable --array=0-7 --export=ALL,SUBMISSIONS=$PWD/submitted "
         "grader/slurm/grade.sbatch)",
         "sbatch --dependency=afterok:$jid grader/slurm/merge.sbatch",
         "sbatch --array=3 --export=ALL,SUBMISSIONS=$PWD/submitted,SHARD_COUNT=8 "
         "grader/slurm/grade.sbatch",
         ".venv/bin/distlab merge grading-shards/shard-* --workdir grading --out scores.csv"]
AUTHORING = ["make notebooks", MAKE_REFERENCES, "make formgrader"]
RUN_BY_CI = ["make test"]   # runs this very suite: .ci/run runs it
CLUSTER = [".venv/bin/python -m distlab.cluster.busbw --max-bytes 64K",
           ".venv/bin/python -m distlab.cluster.train3d",
           ".venv/bin/torchrun --standalone --nproc-per-node=2 -m distlab.cluster.busbw "
           "--max-bytes 64K",
           "mkdir -p logs",
           "sbatch --nodes=2 cluster/slurm/busbw.sbatch --compare --max-bytes 1M",
           "sbatch --nodes=2 cluster/slurm/train3d.sbatch"]
CLUSTER_RESTART = ["sbatch --nodes=2 cluster/slurm/restart.sbatch --steps 6 --save-every 2 "
                   "--crash-at 3:5"]


def test_every_readme_command_is_run():
    shown = readme_commands()
    run = SETUP + SITE + RELEASE + GRADING + SLURM + AUTHORING + RUN_BY_CI + CLUSTER + \
        CLUSTER_RESTART
    assert sorted(shown) == sorted(run), (
        f"README.md and tests/test_readme.py disagree.\n  shown but not run: "
        f"{sorted(set(shown) - set(run))}\n  run but not shown: {sorted(set(run) - set(shown))}\n"
        f"Change the scenario that runs the command together with README.md.")


def test_ci_runs_make_test():
    assert re.search(r"^make test$", (REPO / ".ci" / "run").read_text(), re.M)


def test_readme_commands_are_read_from_bash_blocks_only():
    text = "x `make inline`\n```bash\nmake a   # note\n\n# only a comment\n```\n" \
           "  ```bash\n  make b\n  ```\n```python\nprint(1)\n```\n"
    assert readme_commands(text) == ["make a", "make b"]


class Server:
    """A README command that serves until stopped: started in its own process group."""

    def __init__(self, command: str, course: Path, env: dict | None = None):
        self.command = command
        self.log = open(course / f".server-{abs(hash(command))}.log", "w+")
        self.proc = subprocess.Popen(["bash", "-c", command], cwd=course,
                                     env=env or environ(course), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output())
            if found:
                return found
            assert self.proc.poll() is None, f"`{self.command}` exited:\n{self.output()[-3000:]}"
            time.sleep(0.5)
        raise AssertionError(f"`{self.command}` did not print {pattern!r} within {timeout:g} s:\n"
                             f"{self.output()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as reply:
        return reply.status, reply.read().decode(errors="replace")


def jupyter_answers(server: Server, path: str, timeout: float = 120) -> str:
    """The body of ``path`` on a Jupyter server the command started (its URL carries a token).
    A server prints its URL before it accepts connections, which on a loaded machine may be
    seconds later: a refused connection is tried again for up to ``timeout`` seconds, and if
    the server never answers, the failure shows what it printed."""
    found = server.wait_for(r"(http://(?:127\.0\.0\.1|localhost):\d+)/\S*\?token=(\w+)", 180)
    url = f"{found.group(1)}{path}?token={found.group(2)}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            status, body = get(url)
            break
        except urllib.error.HTTPError:
            raise                        # it answered: with an error, which is the failure
        except OSError as exc:           # refused, reset or timed out: not serving yet
            assert server.proc.poll() is None, (
                f"`{server.command}` exited before {path} answered ({exc}):\n"
                f"{server.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"`{server.command}` printed its URL but {path} did not answer within "
                    f"{timeout:g} s ({exc}); it printed:\n{server.output()[-3000:]}") from exc
            time.sleep(0.5)
    assert status == 200
    return body


def test_jupyter_answers_waits_for_the_server_and_reports_what_it_printed(tmp_path):
    """A server that prints its URL before it listens is waited for; one that never listens
    fails with what it printed (test_setup_commands once saw a refused connection at load 6)."""
    import http.server
    import threading

    port = _free_port()
    printed = f"echo http://127.0.0.1:{port}/lab?token=abc; echo still starting; sleep 60"

    class Status(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"started": "now"}')

        def log_message(self, *args):
            pass

    def listen_later():
        time.sleep(1.5)
        httpd = http.server.HTTPServer(("127.0.0.1", port), Status)
        threading.Thread(target=httpd.handle_request, daemon=True).start()

    server = Server(printed, tmp_path, env=dict(os.environ))
    try:
        threading.Thread(target=listen_later, daemon=True).start()
        assert '"started"' in jupyter_answers(server, "/api/status", timeout=60)
    finally:
        server.stop()
    server = Server(printed.replace(str(port), str(_free_port())), tmp_path, env=dict(os.environ))
    try:
        with pytest.raises(AssertionError, match=r"(?s)did not answer within 1 s.*still starting"):
            jupyter_answers(server, "/api/status", timeout=1)
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Scenarios

def test_setup_commands(course):
    make_lab, doctor, torchrun = SETUP
    server = Server(make_lab, course)
    try:
        assert '"started"' in jupyter_answers(server, "/api/status")
        assert jupyter_answers(server, "/api/contents/01_collectives")  # the labs are its root
        printed = server.output()
    finally:
        server.stop()
    # the formgrader (the instructor's, `make formgrader`) is not loaded, so no warning that it
    # finds no nbgrader_config.py: nothing a student could act on (issue 40)
    assert "No nbgrader_config.py" not in printed, printed[-3000:]
    assert "formgrader | extension was successfully loaded" not in printed, printed[-3000:]
    assert "assignment_list | extension was successfully loaded" in printed   # (what it said)
    out = sh(doctor, course, timeout=300).stdout
    assert re.search(r"2-rank gloo collectives\s+ok", out) and "OK: ready for the labs." in out, out
    (course / "demo.py").write_text(readme_python_example())
    sh(torchrun, course, timeout=300)


def _wait_free(port: int, timeout: float = 120) -> None:
    """The README serves on port 8000: wait while another test run holds it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(1)
    pytest.fail(f"port {port} stayed busy for {timeout:g} s, so `python3 -m http.server` cannot "
                f"serve the site there")


# `make site` ran every lab (the ``course_site`` fixture runs it, for the site's tests too); here
# the students' site (rendered, not run) and one lab once more (the cheapest: test_site.ONE_LAB). Their own limits (900 + 900 s, and
# make site's 1800 s, counted with this test's when it makes the fixture) are what stop a hang.
@pytest.mark.timeout(SITE_TIMEOUT + 1800)
def test_site_commands(course, course_site):
    from distlab import paths
    _, serve, student_site, one_lab = SITE
    labs = paths.labs()
    built, pages, _ = course_site
    assert [p.lab for p in pages] == labs
    assert all((built / p.file).exists() for p in pages), sorted(p.name for p in built.iterdir())
    _wait_free(8000)
    server = Server(serve, course)
    try:
        server.wait_for(r"Serving HTTP on", 60)
        status, body = get("http://127.0.0.1:8000/index.html")
        assert status == 200 and all(lab in body for lab in labs)
    finally:
        server.stop()
    sh(student_site, course, timeout=900)
    # The one-lab site as an instructor who set the course's author and URL in grader/course.cfg
    # (as README says) builds it: test_site.py's checks of what it shows and prints.
    settings = course / "grader" / "course.cfg"
    shipped = settings.read_text()
    settings.write_text(test_site.configured(shipped, test_site.AUTHOR, test_site.URL))
    try:
        done = sh(one_lab, course, timeout=900)
    finally:
        settings.write_text(shipped)
    index = (course / "build" / "site" / "index.html").read_text()
    assert test_site.ONE_LAB in index and LAB1 not in index   # a site of that one lab
    test_site.assert_one_lab_site_shows_the_settings_and_prints_no_noise(
        course / "build" / "site", done.stdout + done.stderr)


def test_release_command(course, course_release):
    _, weekly = RELEASE
    week = course / "build" / "week03"
    # The weekly handout's folder first as a user's (refused, then replaced only with --force,
    # by the command's own argv), then the README's command, unforced, over its own output.
    test_release.assert_a_weekly_handout_replaces_a_users_folder_only_when_forced(
        weekly.split(), week, course, environ(course))
    out = sh(weekly, course, timeout=600).stdout
    assert "hand out this folder" in out, out[-2000:]
    test_release.assert_a_weekly_handout_holds_its_lab_and_no_answer_to_it_or_a_later_one(week)
    # `make release` (RELEASE[0]) ran once for this test and tests/test_release.py's, which use
    # the handout it wrote (conftest.py's ``course_release``).
    handout, out = course_release
    assert handout == course / "build" / "release"
    assert "hand out this folder" in out, out[-2000:]
    assert (handout / "notebooks" / LAB1 / f"{LAB1}.ipynb").is_file()
    assert (handout / "data" / LAB1 / "manifest.json").is_file()
    assert (handout / "distlab" / "__init__.py").is_file() and (handout / "Makefile").is_file()
    assert not (handout / "solutions").exists() and not (handout / "grader").exists()
    # What is in it, and what it must not hold, is tests/test_release.py's.


def _samples(folder: Path) -> dict[str, str]:
    """Three students' Lab 1: a full answer, a partial one, and the untouched lab. Of 8 shards
    (sha256 of the name mod 8) alice is in 0, bob in 1 and walter in 3, the task the README
    submits again."""
    lab = LAB1
    notebooks = {"alice": submissions.solved(lab),
                 "bob": submissions.solved(lab, {"all_reduce_rs_ag", "bandwidths"}),
                 "walter": submissions.student(lab)}
    for student, nb in notebooks.items():
        submissions.write(nb, folder, student, lab)
    return {"alice": "pass", "bob": "not-done", "walter": "not-done"}


def _scores(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [{k: v for k, v in row.items() if k != "feedback"} for row in rows]


def test_grading_commands(course):
    (grade,) = GRADING
    expected = _samples(course / "submitted")
    done = sh(grade, course, timeout=1800)
    rows = {row["student"]: row for row in _scores(course / "scores.csv")}
    assert set(rows) == set(expected)
    assert rows["alice"]["score"] == rows["alice"]["max_score"] != "0"
    assert float(rows["bob"]["score"]) > 0 and rows["walter"]["score"] == "0"
    assert (course / "grading" / "feedback" / "alice" / LAB1 / f"{LAB1}.html").exists()
    for student, row in rows.items():
        _assert_costs_recorded(course / "grading" / "results" / f"{student}.json", row)
    # The similarity report: written beside the grading folders; alice and bob hand in the
    # course's own solution (the samples are made from it), which is all it flags.
    with open(course / "grading" / "similarity.csv", newline="") as f:
        report = list(csv.DictReader(f))
    assert {(r["kind"], r["detail"]) for r in report} == {("course solution", "the whole cell")}
    assert ("alice", "ring_all_reduce") in {(r["student"], r["cell"]) for r in report}
    assert {r["student"] for r in report} == {"alice", "bob"}, report
    assert "answers are the course's own solution (2 students)" in done.stdout, \
        done.stdout[-2000:]

    why = slurm_cluster.missing()
    if why:
        if os.environ.get("DISTLAB_REQUIRE_SLURM") == "1":
            pytest.fail(why)
        pytest.skip(f"Slurm scenario skipped: {why}")
    # The cluster writes scores.csv and grading/ again: keep the single machine's aside.
    single = _scores(course / "scores.csv")
    shutil.move(course / "grading", course / "grading-single")
    (course / "scores.csv").unlink()
    mkdir, submit, merge, resubmit, merge_again = SLURM
    with slurm_cluster.Cluster(course.parent / "slurm") as cluster:
        def run(command: str, timeout: float = 120) -> subprocess.CompletedProcess:
            done = subprocess.run(["bash", "-c", command], cwd=course, text=True, timeout=timeout,
                                  env=environ(course, SLURM_CONF=cluster.env["SLURM_CONF"]),
                                  capture_output=True)
            assert done.returncode == 0, f"`{command}`:\n{done.stdout}\n{done.stderr}"
            return done
        run("\n".join([mkdir, submit, merge]))      # one shell: `jid` is shared, as typed
        cluster.wait_idle(timeout=1500)
        states = cluster.job_states()
        assert states and set(states.values()) == {"COMPLETED"}, (states, cluster.logs(),
                                                                  _logs(course))
        assert _scores(course / "scores.csv") == single
        # A task run again resumes (nobody is graded twice), and the merge can be repeated.
        job = re.search(r"Submitted batch job (\d+)", run(resubmit).stdout).group(1)
        cluster.wait_idle(timeout=600)
        assert set(cluster.job_states().values()) == {"COMPLETED"}, _logs(course)
        again = _logs(course, f"grade-{job}_3.out")
        assert re.search(r"walter\s+skipped: graded before", again), again
    run(merge_again)
    assert _scores(course / "scores.csv") == single


def _assert_costs_recorded(record: Path, row: dict) -> None:
    """A student's record in the README's default work directory (./grading) keeps what the
    notebook cost, each test cell's share (bench/grading_budget.py reads them) and the worker's
    start, which is inside the first lab's cost."""
    entry = json.loads(record.read_text())["labs"][LAB1]
    assert set(entry["test_costs"]) == {t for t in row if t.startswith("test_")}, entry
    spent = [c["cpu_seconds"] for c in [*entry["test_costs"].values(), entry["worker_start"]]]
    # each figure rounded to 0.01 s: half of that per figure apart at most
    assert all(c >= 0 for c in spent), entry
    assert sum(spent) <= entry["cpu_seconds"] + 0.005 * (len(spent) + 1), entry
    assert 0 <= entry["worker_start"]["seconds"] <= entry["seconds"], entry


def _logs(course: Path, pattern: str = "*") -> str:
    return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-1500:]}"
                     for p in sorted((course / "logs").glob(pattern)))


def test_authoring_commands(course, course_references):
    from distlab.course import references
    notebooks, _, formgrader = AUTHORING
    sh(notebooks, course, timeout=900)
    changed = [str(p.relative_to(course)) for p in sorted((course / "notebooks").rglob("*.ipynb"))
               if p.read_bytes() != (REPO / p.relative_to(course)).read_bytes()]
    assert not changed, f"`make notebooks` changed committed student labs: {changed}"
    # `make references` (AUTHORING[1]) ran once for this test and tests/test_notebooks.py's
    # test_references_reproducible, which compares its values with data/ (conftest.py's
    # ``course_references``).
    assert course_references == course / "data"
    # Every lab's references (data/traces/ holds the shipped GPU traces, which no command makes).
    for lab in sorted(p.parent.name for p in (course / "solutions").glob("*/*.py")
                      if p.stem == p.parent.name):
        fresh = (course / "data" / lab / references.MANIFEST).read_text()
        old = (REPO / "data" / lab / references.MANIFEST).read_text()
        # Seeds, shapes and dtypes must agree exactly; values are compared by the manifest's
        # hashes only where the bytes agree (float rounding may differ across machines).
        assert _without_hashes(fresh) == _without_hashes(old), lab
    server = Server(formgrader, course)
    try:
        body = jupyter_answers(server, "/formgrader/api/assignments")
        assert all(lab in body for lab in ("01_collectives", "07_3d_parallelism")), body[:500]
    finally:
        server.stop()


def _without_hashes(manifest: str) -> str:
    return re.sub(r'"(sha256|torch)": "[^"]*"', "", manifest)


# ---------------------------------------------------------------------------------------------
# On a cluster: the course's two programs on the laptop, under torchrun, and on two Slurm nodes

SWEEP_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def _size_label(nbytes: int) -> str:
    """How the sweep's table writes a size (distlab.labs.collectives' units)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024:
            return f"{nbytes:g} {unit}"
        nbytes /= 1024
    return f"{nbytes:g} TiB"


def _assert_every_size(out: str, largest: int, tables: int = 1) -> None:
    """Each of the sweep's ``tables`` (one per group: "# ..." heads each) has a row for every op
    at every size from 8 B to ``largest``, and each op its alpha-beta fit."""
    sections = [part for part in re.split(r"^# ", out, flags=re.M)[1:] if "algbw" in part]
    assert len(sections) == tables, out[-3000:]
    sizes = [_size_label(8 << k) for k in range((largest // 8).bit_length())]
    for section in sections:
        rows = re.findall(r"^(\w+)\s+(\d+ [KMG]?i?B)\s+[\d.]+\s+[\d.]+\s+[\d.]+$", section, re.M)
        for op in SWEEP_OPS:
            assert [size for name, size in rows if name == op] == sizes, (op, section[-3000:])
            assert re.search(rf"^{op}\s+\S+\s+\S+$", section, re.M), section[-3000:]  # fit


def _assert_single_process_losses(out: str, shape: str, steps: int = 3) -> None:
    """The run's losses, as printed, equal single-process training's computed here."""
    from distlab.cluster.train3d import model_config
    from distlab.labs.mesh import LOSS_ATOL, LOSS_RTOL, MeshShape, reference_losses
    assert f"mesh {shape}" in out, out[-3000:]
    pp, dp, tp = (int(v) for v in re.findall(r"\d+", shape))
    reference = reference_losses(model_config(MeshShape(pp, dp, tp), steps), 0).tolist()
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert [int(step) for step, _, _ in rows] == list(range(steps)), out[-3000:]
    for (step, single, mesh), expected in zip(rows, reference):
        assert abs(float(single) - expected) <= 1e-6, (step, single, expected)
        assert abs(float(mesh) - expected) <= LOSS_ATOL + LOSS_RTOL * abs(expected) + 1e-6, \
            (step, mesh, expected)
    assert "losses equal single-process training's" in out, out[-3000:]


@pytest.mark.timeout(1800)
def test_cluster_commands(course):
    busbw, train3d, standalone, mkdir, submit_busbw, submit_train3d = CLUSTER
    _assert_every_size(sh(busbw, course, timeout=600).stdout, largest=64 << 10)
    out = sh(train3d, course, timeout=600).stdout
    _assert_single_process_losses(out, "PP=2 x DP=2 x TP=2")
    assert re.search(r"^tp\s+2\s+within a node", out, re.M), out[-3000:]
    _assert_every_size(sh(standalone, course, timeout=600).stdout, largest=64 << 10)

    why = slurm_cluster.missing()
    if why:
        if os.environ.get("DISTLAB_REQUIRE_SLURM") == "1":
            pytest.fail(why)
        pytest.skip(f"two-node Slurm scenario skipped: {why}")
    # Two nodes on this one host: two slurmd daemons, node1 and node2, with their own names, ports
    # and spool folders (the packaged Slurm is built to allow several slurmd on a host), so each
    # job gets SLURM_NNODES=2 and srun starts one torchrun agent on each node; the agents meet
    # through the c10d rendezvous on node1 (NodeAddr localhost).
    with slurm_cluster.Cluster(course.parent / "slurm-two-nodes", nodes=2) as cluster:
        done = subprocess.run(["bash", "-c", "\n".join([mkdir, submit_busbw, submit_train3d])],
                              cwd=course, text=True, timeout=120, capture_output=True,
                              env=environ(course, SLURM_CONF=cluster.env["SLURM_CONF"]))
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        sweep_job, train_job = re.findall(r"Submitted batch job (\d+)", done.stdout)
        cluster.wait_idle(timeout=1500)
        states = cluster.job_states()
        assert set(states.values()) == {"COMPLETED"}, (states, cluster.logs(), _logs(course))
    sweep = (course / "logs" / f"busbw-{sweep_job}.out").read_text()
    assert "4 ranks = 2 node(s) x 2 process(es) (torchrun)" in sweep, sweep[-3000:]
    _assert_every_size(sweep, largest=1 << 20, tables=2)
    assert "# within a node" in sweep and "# across nodes" in sweep, sweep[-3000:]
    train = (course / "logs" / f"train3d-{train_job}.out").read_text()
    assert "4 ranks = 2 node(s) x 2 process(es) (torchrun)" in train, train[-3000:]
    _assert_single_process_losses(train, "PP=2 x DP=1 x TP=2")
    assert re.search(r"^pp\s+2\s+across nodes", train, re.M), train[-3000:]
    assert re.search(r"^tp\s+2\s+within a node", train, re.M), train[-3000:]


@pytest.mark.timeout(1200)
def test_cluster_restart_command(course, tmp_path):
    # README's restartable run on two Slurm nodes (two slurmd daemons on this host, as above):
    # a rank SIGKILLs itself, torchrun's agents restart the workers, and they resume from the
    # shared checkpoint folder and land on an uninterrupted run of the same loop (distlab.run,
    # the same world size), to the last bit; the job's checkpoints are removed once it succeeds,
    # and a job submitted on a user's folder of checkpoints resumes there and leaves it alone.
    import torch

    import distlab
    from distlab.labs.checkpoint.restart import complete_checkpoints, train_resumable
    [submit] = CLUSTER_RESTART
    steps, save_every, crash_step = (int(re.search(rf"--{flag} (?:\d+:)?(\d+)", submit).group(1))
                                     for flag in ("steps", "save-every", "crash-at"))
    why = slurm_cluster.missing()
    if why:
        if os.environ.get("DISTLAB_REQUIRE_SLURM") == "1":
            pytest.fail(why)
        pytest.skip(f"two-node Slurm restart skipped: {why}")
    resumed_from = (crash_step - 1) // save_every * save_every
    reference = distlab.run(train_resumable, 4, str(tmp_path / "reference"), steps, save_every,
                            timeout=300)[0]
    # A user's own folder of checkpoints (the uninterrupted run's, up to where the job resumes):
    # a job submitted on it (as README.md says) resumes there and leaves the folder alone.
    kept = tmp_path / "mine"
    for step, folder in complete_checkpoints(str(tmp_path / "reference")):
        if step <= resumed_from:
            shutil.copytree(folder, kept / Path(folder).name)
    with slurm_cluster.Cluster(course.parent / "slurm-restart", nodes=2) as cluster:
        job, out = _submit_restart(cluster, course, f"mkdir -p logs\n{submit}", "COMPLETED")
        again, again_out = _submit_restart(   # this time no rank dies
            cluster, course, re.sub(r" --crash-at \S+", "", submit).replace(
                "sbatch ", f"sbatch --export=ALL,CHECKPOINTS={kept} ", 1), "COMPLETED")
    assert "2 node(s) (node[1-2]) x 2 process(es)" in out, out[-3000:]
    assert "failed (exitcode: -9)" in out, out[-3000:]     # an agent saw the SIGKILL
    result = torch.load(course / "logs" / f"restart-{job}.pt", weights_only=True)
    assert len(result["restarts"]) == 4, result["restarts"]
    # The failed node's agent counted its restart; the other may have restarted its workers
    # without counting (it joined the round the failed one opened).
    assert max(result["restarts"]) == 1, result["restarts"]
    assert result["resumed_from"] == resumed_from, result["resumed_from"]
    assert not (course / "logs" / f"restart-{job}").exists()    # checkpoints removed
    assert sorted(result["losses"]) == list(range(resumed_from + 1, steps + 1))
    for step, loss in result["losses"].items():
        assert loss == reference["losses"][step], (step, loss, reference["losses"][step])
        assert f"{step:>6}  {loss!r}" in out, out[-3000:]       # as the job printed them
    for name, value in reference["params"].items():
        assert torch.equal(result["params"][name], value), name
    assert [step for step, _ in complete_checkpoints(str(kept))][-1] == steps   # still there
    resumed = torch.load(course / "logs" / f"restart-{again}.pt", weights_only=True)
    assert resumed["resumed_from"] == resumed_from and set(resumed["restarts"]) == {0}, again_out
    assert resumed["losses"] == result["losses"]
    for name, value in reference["params"].items():
        assert torch.equal(resumed["params"][name], value), name


def _submit_restart(cluster, course: Path, command: str, state: str) -> tuple[str, str]:
    """Submit ``command`` (one sbatch of cluster/slurm/restart.sbatch), wait for it to end in
    ``state``; (job id, its log)."""
    done = subprocess.run(["bash", "-c", command], cwd=course, text=True, timeout=120,
                          capture_output=True,
                          env=environ(course, SLURM_CONF=cluster.env["SLURM_CONF"]))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    [job] = re.findall(r"Submitted batch job (\d+)", done.stdout)
    cluster.wait_idle(timeout=900)
    log = course / "logs" / f"restart-{job}.out"
    out = log.read_text() if log.exists() else ""
    assert cluster.job_states().get(job) == state, (cluster.job_states(), out[-5000:],
                                                    cluster.logs())
    return job, out
