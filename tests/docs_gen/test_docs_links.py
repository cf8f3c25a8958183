"""Every link between the README and the docs/ pages lands on a file and heading that exist."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """`text` without fenced code blocks (a `](x)` inside code is not a link)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {heading_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", _prose(page.read_text()), re.M)}


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_heading_anchor_follows_github():
    assert heading_anchor("Does greedy find the best config? (`make bench-tune`)") == \
        "does-greedy-find-the-best-config-make-bench-tune"
    assert heading_anchor("`torchpace tune` on an inference workload") == "torchpace-tune-on-an-inference-workload"


def test_relative_links_resolve_to_files_and_headings():
    broken = []
    for page in _pages():
        for target in _LINK.findall(_prose(page.read_text())):
            if re.match(r"^[a-z]+:", target):  # http(s), mailto: not ours to check
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_reachable_from_the_readme():
    seen, pending = set(), [REPO / "README.md"]
    while pending:
        page = pending.pop()
        if page in seen or page.suffix != ".md" or not page.exists():
            continue
        seen.add(page)
        pending += [(page.parent / t.partition("#")[0]).resolve() for t in _LINK.findall(_prose(page.read_text()))
                    if not re.match(r"^[a-z]+:", t) and t.partition("#")[0]]
    unreachable = [str(p.relative_to(REPO)) for p in _pages() if p not in seen]
    assert not unreachable, f"no link leads to: {unreachable}"


_CODE_REF = re.compile(r"\bdocs/[\w/.-]+\.md(?:#[\w-]+)?")


def test_references_from_the_code_to_the_docs_resolve():
    """A docstring or comment citing `docs/PAGE.md#heading` names a page and a heading that exist."""
    broken = []
    for source in sorted([*(REPO / "src" / "torchpace").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py")]):
        for target in _CODE_REF.findall(source.read_text()):
            path, _, anchor = target.partition("#")
            if not (REPO / path).exists():
                broken.append(f"{source.relative_to(REPO)}: {target} (no such file)")
            elif anchor and anchor not in _anchors(REPO / path):
                broken.append(f"{source.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
