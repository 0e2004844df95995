"""Every ```python block of README.md and docs/*.md runs, as a reader would run it.

Each Markdown file's blocks run in order in one fresh namespace, in a fresh
process whose working directory is an empty temporary folder, so a block
may use what an earlier block of the same page defined or wrote, and nothing
else. The process is forked from one that has imported the heavy libraries
(torch, pandas, pyarrow, dask, dask_windows) once, instead of importing them
again for every page (about 5 CPU-s a page); names are never shared. Files are globbed when the tests are collected, so a new page is tested
without touching this file.

The convention (also in CONTRIBUTING.md and docs/architecture.md):

* a block directly preceded by a line ``<!-- no-run: REASON -->`` is not run;
  it shows up as a skipped test carrying REASON;
* a block directly preceded by ``<!-- needs: MODULE[, MODULE...] -->`` runs only
  where every MODULE imports (a package the ``test`` extra does not install,
  such as fastai); elsewhere the page runs without it and the block shows up as
  a skipped test naming the missing module and its ``pip install`` line. A block
  importing a module of ``OPTIONAL`` must carry the marker (a test checks);
* an HTML comment ``<!-- setup:`` ... ``-->`` holds Python code that runs at
  its place on the page but is not shown (a reader sees only the result of
  it, e.g. data in an S3 bucket). Prefer a visible setup block;
* ``s3://`` URLs reach a moto S3 server on 127.0.0.1 that the test starts for
  a page mentioning ``s3://``: the subprocess gets ``AWS_ENDPOINT_URL`` and
  test credentials in its environment, so snippets keep the exact
  ``storage_options`` a user writes. Other remote stores must be no-run.

A failing block's traceback names the Markdown file and the line in it.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = sorted([os.path.join(REPO, "README.md"), *glob.glob(os.path.join(REPO, "docs", "*.md"))])
TIMEOUT_S = 600  # per page; generous because the machine is shared

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")  # a fence opening: its marker and language
_NO_RUN = re.compile(r"^\s*<!--\s*no-run:(.*?)-->\s*$")
_NEEDS = re.compile(r"^\s*<!--\s*needs:(.*?)-->\s*$")
#: modules a snippet may use that the README's test command (the ``test`` extra) does not install,
#: with the line that installs each (CI installs fastai through .ci/extras)
OPTIONAL = {
    "fastai": "bash .ci/extras (fastai without torchvision, beside the pinned torch)",
    "tsai": "pip install -c .ci/constraints.txt tsai",
    "pytorch_forecasting": "bash .ci/extras (pytorch-forecasting --no-deps, beside pandas 3.1)",
}
_SETUP_OPEN = re.compile(r"^\s*<!--\s*setup:\s*$")
_SETUP_CLOSE = re.compile(r"^\s*-->\s*$")


@dataclasses.dataclass
class Block:
    """One piece of Python on a page: a shown block, or hidden setup code."""

    line: int  # 1-based line of the block's first code line in the page
    code: str
    skip: str | None = None  # the no-run reason
    hidden: bool = False
    needs: tuple[str, ...] = ()  # modules the block runs only with (the needs marker)


def extract(text: str) -> list[Block]:
    """The Python blocks of a Markdown text, in page order.

    Raises:
        ValueError: an unclosed fence or setup comment, or a no-run marker without a reason.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    previous = ""  # the last non-blank line before the current one
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence and fence.group(2) != "python":  # another language: skip to its close, python inside included
            closing = re.compile(rf"^\s*{re.escape(fence.group(1))}\s*$")
            end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), len(lines))
            previous, i = lines[min(end, len(lines) - 1)], end + 1
            continue
        opened = fence is not None
        if opened or _SETUP_OPEN.match(line):
            closing = re.compile(rf"^\s*{re.escape(fence.group(1))}\s*$") if fence else _SETUP_CLOSE
            end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
            if end is None:
                raise ValueError(f"line {i + 1}: {'```python fence' if opened else 'setup comment'} is never closed")
            code = textwrap.dedent("\n".join(lines[i + 1 : end]))
            skip = None
            needs: tuple[str, ...] = ()
            marker = _NO_RUN.match(previous) if opened else None
            if marker:
                skip = marker.group(1).strip()
                if not skip:
                    raise ValueError(f"line {i + 1}: <!-- no-run: --> needs a reason")
            needed = _NEEDS.match(previous) if opened else None
            if needed:
                needs = tuple(m.strip() for m in needed.group(1).split(",") if m.strip())
                if not needs:
                    raise ValueError(f"line {i + 1}: <!-- needs: --> names no module")
            blocks.append(Block(i + 2, code, skip, hidden=not opened, needs=needs))
            previous, i = lines[end], end + 1
            continue
        if line.strip():
            previous = line
        i += 1
    return blocks


def _rel(path: str) -> str:
    return os.path.relpath(path, REPO)


def _page_blocks(path: str) -> list[Block]:
    with open(path, encoding="utf-8") as f:
        return extract(f.read())


_DRIVER = r"""
import json, sys
page, blocks = sys.argv[1], json.load(open(sys.argv[2]))
namespace = {"__name__": "__main__"}
for block in blocks:
    # pad with newlines so that tracebacks show the page's own line numbers and text
    exec(compile("\n" * (block["line"] - 1) + block["code"], page, "exec"), namespace)
"""

#: A process that imports the heavy libraries once, then forks a child per page (one request, a
#: JSON line on stdin, at a time). The child starts a session of its own (so that a timeout kills
#: it and what it started), takes the page's working folder, environment and output files, runs
#: the page like ``python -c _DRIVER page spec``, and exits the way an interpreter does (exit
#: functions, non-daemon threads joined). The parent answers ``{"pid": ...}``, then ``{"rc": ...}``.
_ZYGOTE = r"""
import atexit, json, os, sys, threading, traceback
import numpy, pandas, pyarrow.parquet, torch, dask, dask.dataframe, distributed, dask_windows
assert threading.active_count() == 1, "the zygote must hold no thread when it forks"
driver = sys.argv[1]
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.chdir(job["cwd"])
        os.environ.update(job["env"])
        for fd, name in ((1, job["out"]), (2, job["err"])):
            target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(target, fd)
            os.close(target)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        sys.argv = ["-c", job["page"], job["spec"]]
        code = 0
        try:
            exec(compile(driver, "<driver>", "exec"), {"__name__": "__driver__"})
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            threading._shutdown()  # what the interpreter does at exit: thread-pool exit hooks, joins
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class _Zygote:
    """The test's end of ``_ZYGOTE``: ``run`` one page in a forked child, with a time limit."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE, _DRIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_env(None),
            text=True,
        )

    def _answer(self, deadline: float) -> dict:
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(max(deadline - time.monotonic(), 0)):
                raise TimeoutError
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the docs test's zygote process exited ({self.proc.wait()})")
        return json.loads(line)

    def run(self, page: str, spec: str, cwd: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
        out, err = os.path.join(os.path.dirname(spec), "out.txt"), os.path.join(os.path.dirname(spec), "err.txt")
        job = {"page": page, "spec": spec, "cwd": cwd, "env": env, "out": out, "err": err}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        pid = self._answer(deadline)["pid"]
        try:
            rc = self._answer(deadline)["rc"]
        except TimeoutError:
            os.killpg(pid, 9)
            self._answer(time.monotonic() + 60)
            raise subprocess.TimeoutExpired(page, timeout) from None
        with open(out, encoding="utf-8", errors="replace") as o, open(err, encoding="utf-8", errors="replace") as e:
            return subprocess.CompletedProcess(page, rc, o.read(), e.read())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def zygote():
    started = _Zygote()
    yield started
    started.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    """Start a moto S3 server on 127.0.0.1 on first use, in a process of its own (moto's state is
    per process: a server in this one would share buckets with other tests' servers); yields its URL."""
    started = []

    def start() -> str:
        if not started:
            pytest.importorskip("s3fs")
            pytest.importorskip("moto.server")
            port = _free_port()
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            started.append((proc, f"http://127.0.0.1:{port}"))
            deadline = time.monotonic() + 60
            while True:  # until it accepts connections (bounded)
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the moto S3 server did not start") from None
                    time.sleep(0.1)
        return started[0][1]

    yield start
    for proc, _ in started:
        proc.terminate()
        proc.wait(timeout=30)


def _env(endpoint: str | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if endpoint is not None:
        env.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_CONFIG_FILE=os.devnull,
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        )
    return env


def _missing(block: Block) -> list[str]:
    """The modules a block needs that do not import here."""
    return [m for m in block.needs if importlib.util.find_spec(m.split(".")[0]) is None]


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_page_snippets_run(page, tmp_path, s3_endpoint, zygote):
    # a block needing a missing module is left out here and reported by test_needs_snippet as a skip
    blocks = [b for b in _page_blocks(page) if b.skip is None and not _missing(b)]
    if not blocks:
        pytest.skip(f"{_rel(page)} has no Python block to run")
    endpoint = s3_endpoint() if any("s3://" in b.code for b in blocks) else None
    work = tmp_path / "work"
    work.mkdir()
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps([{"line": b.line, "code": b.code} for b in blocks]))
    extra = {k: v for k, v in _env(endpoint).items() if os.environ.get(k) != v and k != "PYTHONPATH"}
    done = zygote.run(page, str(spec), str(work), extra, TIMEOUT_S)
    assert done.returncode == 0, (
        f"a snippet of {_rel(page)} failed (the traceback names the page's line):\n"
        f"{done.stderr[-6000:]}\n--- stdout ---\n{done.stdout[-2000:]}"
    )


_NEEDING = [(page, b) for page in PAGES for b in _page_blocks(page) if b.needs and b.skip is None]


@pytest.mark.parametrize(("page", "block"), _NEEDING, ids=[f"{_rel(p)}:{b.line}" for p, b in _NEEDING])
def test_needs_snippet(page, block):
    """A block with a needs marker ran in its page's test where its modules import; a skip otherwise."""
    missing = _missing(block)
    if missing:
        how = "; ".join(f"{m}: {OPTIONAL.get(m.split('.')[0], f'pip install {m}')}" for m in missing)
        pytest.skip(f"{_rel(page)}:{block.line - 1} needs {', '.join(missing)}, not installed ({how})")


_IMPORT = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", re.M)


def _imported(code: str) -> set[str]:
    """The top-level modules a block's import statements name."""
    return set(_IMPORT.findall(code))


def test_optional_imports_carry_a_needs_marker():
    unmarked = [
        f"{_rel(page)}:{b.line} imports {', '.join(sorted(_imported(b.code) & OPTIONAL.keys()))}"
        for page in PAGES
        for b in _page_blocks(page)
        if b.skip is None and (_imported(b.code) & OPTIONAL.keys()) - {m.split(".")[0] for m in b.needs}
    ]
    assert not unmarked, "add <!-- needs: MODULE --> before these blocks: " + "; ".join(unmarked)


_SKIPPED = [(page, b) for page in PAGES for b in _page_blocks(page) if b.skip is not None]


@pytest.mark.parametrize(("page", "block"), _SKIPPED, ids=[f"{_rel(p)}:{b.line}" for p, b in _SKIPPED])
def test_no_run_snippet(page, block):
    pytest.skip(f"{_rel(page)}:{block.line - 1}: {block.skip}")


def test_extract_follows_the_convention():
    page = textwrap.dedent(
        """\
        # Title

        ```python
        a = 1
        ```

        <!-- no-run: needs a GPU -->
        ```python
        b = 2
        ```

        <!-- setup:
        c = 3
        -->
        ```bash
        echo not python
        ```
        * a list item:

          ```python
          if a:
              d = 4
          ```

        ````markdown
        ```python
        not_run = True
        ```
        ````
        """
    )
    blocks = extract(page)
    assert [(b.line, b.code, b.skip, b.hidden) for b in blocks] == [
        (4, "a = 1", None, False),
        (9, "b = 2", "needs a GPU", False),
        (13, "c = 3", None, True),
        (21, "if a:\n    d = 4", None, False),
    ]
    with pytest.raises(ValueError, match="never closed"):
        extract("```python\nx = 1\n")
    with pytest.raises(ValueError, match="needs a reason"):
        extract("<!-- no-run: -->\n```python\nx = 1\n```\n")
    needing = extract("<!-- needs: fastai, tsai.learner -->\n```python\nimport fastai\n```\n```python\ny = 2\n```\n")
    assert [(b.needs, b.skip) for b in needing] == [(("fastai", "tsai.learner"), None), ((), None)]
    assert _missing(Block(1, "", needs=("json", "no_such_module_here"))) == ["no_such_module_here"]
    with pytest.raises(ValueError, match="names no module"):
        extract("<!-- needs: -->\n```python\nx = 1\n```\n")


def test_every_page_parses_and_names_its_skips():
    for page in PAGES:
        for block in _page_blocks(page):  # raises on a malformed page
            assert block.code.strip(), f"{_rel(page)}:{block.line}: empty Python block"


# --- links between the pages ---

#: pages other changes are writing; links to them are allowed before they exist
RESERVED = {
    "docs/cli.md",
    "docs/checks.md",
    "docs/mixing.md",
    "docs/frameworks.md",
    "docs/benchmarks.md",
    "docs/pretraining.md",
}
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"^(`{3,}|~{3,}).*?^\1", "", f.read(), flags=re.S | re.M)  # no headings inside fences
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, flags=re.M)}


def _links(page: str) -> list[tuple[str, str]]:
    """(target file relative to the repository, anchor) of every relative link on a page."""
    with open(page, encoding="utf-8") as f:
        text = re.sub(r"^(`{3,}|~{3,}).*?^\1", "", f.read(), flags=re.S | re.M)
    found = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        found.append((_rel(file), anchor))
    return found


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_links_point_at_pages_and_headings_that_exist(page):
    broken = []
    for target, anchor in _links(page):
        path = os.path.join(REPO, target)
        if not os.path.exists(path):
            if target not in RESERVED:
                broken.append(f"{target} does not exist")
        elif anchor and target.endswith(".md") and anchor not in _anchors(path):
            broken.append(f"{target} has no heading for #{anchor}")
    assert not broken, f"{_rel(page)}: " + "; ".join(broken)


def test_reserved_pages_exist():
    missing = sorted(page for page in RESERVED if not os.path.exists(os.path.join(REPO, page)))
    if missing:
        pytest.skip(f"linked but not written yet: {', '.join(missing)}")


def test_readme_commands_are_what_ci_and_the_demo_run():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as f:
        ci_command = [line for line in f.read().splitlines() if line.startswith("python -m pip install")]
    assert ci_command and ci_command[-1] in readme, "README.md must show the exact test command .ci/run runs"
    demo = (
        'python -m pip install "torch==2.13.0" && python -m pip install -e ".[demo]" && python examples/pretrain_mvp.py'
    )
    assert demo in readme
    assert os.path.exists(os.path.join(REPO, "examples", "pretrain_mvp.py"))
