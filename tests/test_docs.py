"""The documentation works as written.

* Every ```python block of README.md runs, in order, in one namespace, against the built
  package (so the quick start cannot drift from the API); ```python blocks in docs/ run too, one
  namespace per file (blocks that are not meant to run are marked ```text).
* Every relative link in README.md, CHANGELOG.md and docs/**/*.md points at an existing file,
  and a `#fragment` at an existing heading of the target page (GitHub's anchor rule).
* The repository stands alone: no file points at the workspace outside it.
"""

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOC_FILES = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def code_blocks(text, lang):
    """(first line number, source) of each fenced block whose info string is exactly `lang`."""
    out = []
    for m in _FENCE.finditer(text):
        if m.group(1).strip() == lang:
            out.append((text.count("\n", 0, m.start(2)) + 1, m.group(2)))
    return out


def _without_fences(text):
    """The text with fenced blocks blanked (line numbers kept): headings only count outside."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def _prose(text):
    """The text without fenced blocks and inline code: links only count there."""
    return _INLINE_CODE.sub("", _without_fences(text))


def github_slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation other than '-' and '_' dropped,
    spaces to hyphens."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    """Every anchor GitHub generates for the headings of a Markdown file (duplicates get -1, -2)."""
    seen, out = {}, set()
    # A heading's inline code is part of its anchor ("## On a GPU machine: `make gpu-test`" is
    # #on-a-gpu-machine-make-gpu-test on GitHub), so headings are read with it.
    for m in _HEADING.finditer(_without_fences(path.read_text(encoding="utf-8"))):
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def link_problems(path, root=ROOT):
    """Broken relative links of one Markdown file (in the repository at `root`), as strings."""
    problems = []
    for m in _LINK.finditer(_prose(path.read_text(encoding="utf-8"))):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}: link {target!r}"
        if not dest.exists():
            problems.append(f"{where}: no such file {dest}")
            continue
        try:
            dest.relative_to(root)
        except ValueError:
            problems.append(f"{where}: points outside the repository")
            continue
        if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            problems.append(
                f"{where}: no heading with anchor #{fragment} in {dest.relative_to(root)}"
            )
    return problems


def run_blocks(blocks, label):
    namespace = {"__name__": f"__doc_example__{label}"}
    for line, source in blocks:
        exec(compile(source, f"{label}, python block at line {line}", "exec"), namespace)
    return namespace


# ---- the README's examples --------------------------------------------------------------------
def test_readme_python_blocks_run():
    blocks = code_blocks(README.read_text(encoding="utf-8"), "python")
    assert len(blocks) >= 4, "the README's quick start should have its four python examples"
    run_blocks(blocks, "README.md")


def test_docs_python_blocks_run():
    """```python blocks in the other pages run too, one namespace per page."""
    for path in DOC_FILES[1:]:
        run_blocks(
            code_blocks(path.read_text(encoding="utf-8"), "python"), str(path.relative_to(ROOT))
        )


# ---- links ------------------------------------------------------------------------------------
def test_doc_pages_exist():
    """The pages the README and the checklist in docs/development.md promise. (A copy of the
    repository that runs the tests, such as `make sanitize`'s, must carry docs/ too.)"""
    missing = [
        page
        for page in [
            "README.md",
            "CHANGELOG.md",
            "LICENSE",
            "docs/index.md",
            "docs/errors.md",
            "docs/parity.md",
            "docs/benchmarks.md",
            "docs/development.md",
            "docs/ops/fused_batch_norm.md",
            "docs/ops/fractional_pool.md",
            "docs/ops/depthwise_conv2d.md",
            "docs/ops/cudnn_rnn.md",
        ]
        if not (ROOT / page).is_file()
    ]
    assert not missing, f"missing under {ROOT}: {missing}"


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    problems = link_problems(path)
    assert not problems, "\n".join(problems)


def test_every_doc_page_is_linked_from_the_index():
    index = ROOT / "docs" / "index.md"
    linked = {
        (index.parent / m.group(1).partition("#")[0]).resolve()
        for m in _LINK.finditer(_prose(index.read_text(encoding="utf-8")))
    }
    missing = [
        str(p.relative_to(ROOT))
        for p in DOC_FILES
        if p.is_relative_to(ROOT / "docs")
        and p != index
        and p.resolve() not in linked
        and p.name != "kernel-comments.md"
    ]
    assert not missing, f"docs/index.md does not list: {missing}"


def test_link_checker_catches_broken_links(tmp_path):
    """The checker itself can fail: a missing file and a missing heading are both reported;
    links in code and web links are not checked."""
    (tmp_path / "other.md").write_text("# Real heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#real-heading) [gone](missing.md) [bad](other.md#nope)\n"
        "`[in code](missing.md)`\n```\n[in a block](missing.md)\n```\n"
        "[web](https://example.org/x)\n"
    )
    problems = link_problems(page, root=tmp_path)
    assert len(problems) == 2, problems
    assert "missing.md" in problems[0] and "#nope" in problems[1]


def test_github_slugs():
    assert github_slug("torch_tfgrads.nn.FusedBatchNorm") == "torch_tfgradsnnfusedbatchnorm"
    assert github_slug("Where it differs from `TensorFlow`") == "where-it-differs-from-tensorflow"
    assert (
        github_slug("fractional_avg_pool and fractional_max_pool")
        == "fractional_avg_pool-and-fractional_max_pool"
    )


def test_anchors_follow_github(tmp_path):
    # A heading's inline code stays in its anchor (GitHub keeps the code's text); a line of a
    # fenced block is no heading.
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## On a GPU machine: `make gpu-test`\n\n```text\n# not a heading\n```\n"
        "## Title\n",
        encoding="utf-8",
    )
    assert anchors(page) == {"title", "on-a-gpu-machine-make-gpu-test", "title-1"}


# ---- the repository stands alone --------------------------------------------------------------
_SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "__pycache__", ".pytest_cache"}
_TEXT_SUFFIXES = {
    ".md",
    ".py",
    ".cpp",
    ".h",
    ".cu",
    ".cuh",
    ".toml",
    ".cfg",
    ".txt",
    ".sh",
    ".yml",
    ".yaml",
}
_OUTSIDE = re.compile(r"\.\./shared|\bspec (?:[A-Z]\d|§|README)|\bAPI\.md\b")


def _repository_text_files():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        for name in filenames:
            path = Path(dirpath) / name
            if path.suffix in _TEXT_SUFFIXES or name in ("Makefile", "run"):
                yield path


def test_docs_do_not_point_outside_the_repository():
    hits = [
        f"{p.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
        for p in DOC_FILES
        for text in [p.read_text(encoding="utf-8")]
        for m in _OUTSIDE.finditer(text)
    ]
    assert not hits, "\n".join(hits)


def test_repository_does_not_point_outside_itself():
    """Sources and comments say the fact itself or point into docs/, never at ../shared or at
    labels of a spec that is not in the repository."""
    me = Path(__file__).resolve()
    hits = []
    for p in _repository_text_files():
        if p.resolve() == me:
            continue
        text = p.read_text(encoding="utf-8", errors="replace")
        hits += [
            f"{p.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
            for m in _OUTSIDE.finditer(text)
        ]
    assert not hits, "\n".join(hits)
