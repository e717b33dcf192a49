"""The docs stay true to the tree: README.md is a front door (under 400 lines), every repository path the Markdown
files name exists (in backticks, in code blocks, in prose or as a link), every link to a heading lands on one, and
nothing points at folders outside the repository.

A "repository path" is a word with a slash whose first part is a top-level folder that git tracks
(``serving/api/app.py``, ``configs/gates/default.yaml``, ``infra/docker/{training,serving}.Dockerfile`` expanded); a
pytest id (``tests/x.py::test_y``) must name a function of that file too. Left alone: URLs, words with placeholders or
globs (``reports/drift/<time>/``, ``spec-*.json``, ``$LIFECYCLE_HOME/...``), paths under the lifecycle home, whose first
parts (``reports/``, ``mlflow/``, ``cache/``) are not repository folders, and paths git ignores (``infra/.env``, which
its user makes). Links resolve from the linking file's folder, as GitHub renders them.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 400
# the docs a reader of the repository sees (not a hidden folder's: .pytest_cache has a README of its own); a test of
# its own below checks it found them
DOCS = sorted(
    doc
    for doc in {REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("*/README.md"), *REPO.glob("infra/*/README.md")}
    if not any(part.startswith(".") for part in doc.relative_to(REPO).parts)
)

FENCE = re.compile(r"^\s*```")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SEPARATORS = re.compile(r"[\s=\"'(),;|]+")
NOT_A_PATH = re.compile(r"[<>*?$~@\[\]]|://")  # placeholders, globs, home paths, model refs, URLs
BRACES = re.compile(r"\{([^{}\s]*,[^{}\s]*)\}")
ALTERNATIVE = "\0"  # a comma inside braces, kept from the word splitting
OUTSIDE = re.compile(r"\.\./shared|\bshared/CONVENTIONS")


def tracked_top_level() -> set[str]:
    """The first part of every file git tracks (folders and top-level files); without git, the repository's
    entries that are not hidden (``.ci`` aside) nor build output."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {p.name for p in REPO.iterdir() if p.name == ".ci" or not p.name.startswith(".")} - {
            "chat_lifecycle.egg-info"
        }
    return {name.split("/", 1)[0] for name in out.split("\0") if name}


TOP = tracked_top_level()


def ignored(path: str) -> bool:
    """A path git ignores is one its user makes (``infra/.env`` from its example), not one the repository ships."""
    try:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def lines_of(doc: Path) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, inside a code block) for every line but the fences."""
    in_code = False
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        yield number, line, in_code


def expand(word: str) -> list[str]:
    """``a/{b,c}.py`` -> ``a/b.py``, ``a/c.py`` (one level, as the docs write them)."""
    m = re.search(rf"\{{([^{{}}]*{ALTERNATIVE}[^{{}}]*)\}}", word)
    if m is None:
        return [word]
    parts = m.group(1).split(ALTERNATIVE)
    return [w for part in parts for w in expand(word[: m.start()] + part + word[m.end() :])]


def repo_paths(text: str) -> Iterator[str]:
    """The repository paths a piece of text names (see the module docstring for what counts)."""
    text = BRACES.sub(lambda m: "{" + m.group(1).replace(",", ALTERNATIVE) + "}", LINK.sub(" ", text))
    for raw in SEPARATORS.split(text):
        word = raw.strip("`*.:,!").removeprefix("./")
        if "/" not in word or NOT_A_PATH.search(word):
            continue
        for path in expand(word):
            path = re.sub(r":\d+$", "", path)  # file:line
            if path.split("/", 1)[0] in TOP:
                yield path


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `_` and `-` dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line, in_code in lines_of(doc):
        m = re.match(r"#{1,6}\s+(.*)", line)
        if in_code or m is None:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def missing_paths(doc: Path) -> list[str]:
    """``file:line: what`` for every named repository path, link or anchor of ``doc`` that does not exist."""
    problems = []
    rel = doc.relative_to(REPO) if doc.is_relative_to(REPO) else doc.name
    for number, line, in_code in lines_of(doc):
        for path in set(repo_paths(line)):
            file, _, test = path.partition("::")
            if not (REPO / file).exists() and not ignored(file):
                problems.append(f"{rel}:{number}: {path} does not exist")
            elif test and not re.search(
                rf"^\s*(async )?(def|class) {re.escape(test.split('::')[0])}\b",
                (REPO / file).read_text(encoding="utf-8"),
                re.MULTILINE,
            ):
                problems.append(f"{rel}:{number}: {file} has no {test}")
        if in_code:
            continue
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            if not dest.exists():
                problems.append(f"{rel}:{number}: link {target} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{rel}:{number}: link {target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    return problems


def test_the_docs_are_found() -> None:
    names = {str(d.relative_to(REPO)) for d in DOCS}
    assert {"README.md", "docs/architecture.md", "docs/results.md", "docs/serving.md"} <= names, names
    assert {"serving", "configs", "docs", "tests"} <= TOP, TOP


def test_the_readme_is_a_front_door() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; move reference text to docs/"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(REPO)))
def test_every_path_and_link_a_doc_names_exists(doc: Path) -> None:
    assert not missing_paths(doc), "\n".join(missing_paths(doc))


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(REPO)))
def test_the_docs_stay_inside_the_repository(doc: Path) -> None:
    hits = [f"{n}: {line.strip()}" for n, line, _ in lines_of(doc) if OUTSIDE.search(line)]
    assert not hits, hits


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("see `serving/api/app.py` and [the config](configs/tiny.yaml)", {"serving/api/app.py"}),
        (
            "`lifecycle train --set finetune.deepspeed_config=infra/deepspeed/zero3.json`",
            {"infra/deepspeed/zero3.json"},
        ),
        (
            "`infra/docker/{training,serving}.Dockerfile`",
            {"infra/docker/training.Dockerfile", "infra/docker/serving.Dockerfile"},
        ),
        ("`tests/integration/test_train.py::test_x`", {"tests/integration/test_train.py::test_x"}),
        ("`reports/run-<time>/report.md`, `serving/spec-*.json`, `$LIFECYCLE_HOME/serving/serving.db`", set()),
        ("`mlflow/audit.jsonl`, `chat/3`, `chat@champion`, https://example.com/serving/x.py, `/v1/models`", set()),
    ],
)
def test_what_counts_as_a_repository_path(text: str, named: set[str]) -> None:
    assert set(repo_paths(text)) == named


def test_a_missing_file_test_or_heading_is_named(tmp_path: Path) -> None:
    loop = REPO / "docs" / "loop.md"
    doc = tmp_path / "doc.md"
    doc.write_text(
        "See `serving/api/app.py`, `serving/no_such_module.py` and `tests/unit/test_docs.py::test_no_such_test`.\n"
        f"[rollouts]({loop}#rollouts), [gone]({loop}#no-such-heading), [none](nothing.md)\n"
        "```\nlifecycle train --set finetune.deepspeed_config=infra/deepspeed/zero4.json\n```\n",
        encoding="utf-8",
    )
    assert set(missing_paths(doc)) == {
        "doc.md:1: serving/no_such_module.py does not exist",
        "doc.md:1: tests/unit/test_docs.py has no test_no_such_test",
        f"doc.md:2: link {loop}#no-such-heading: no heading #no-such-heading in docs/loop.md",
        "doc.md:2: link nothing.md does not exist",
        "doc.md:4: infra/deepspeed/zero4.json does not exist",
    }
