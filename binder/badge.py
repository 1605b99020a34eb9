"""The Binder badge of README.md and notebooks/README.md, built from pyproject.toml's ``[project.urls]``.

A Binder link needs the repository's public GitHub path (``owner/name``),
which a checkout does not know by itself. Once ``[project.urls]`` has a
``Repository`` (or ``Source``/``Homepage``) on github.com, this script
writes the badge between the ``<!-- binder-badge -->`` markers of both files;
until then it writes nothing there (the to-do is in docs/maintainers.md),
rather than a link to a placeholder that leads nowhere.

    python binder/badge.py           # rewrite both files
    python binder/badge.py --check   # exit 1 when a file is not what pyproject.toml says (make binder-check)

Standard library only: it runs before anything is installed.
"""

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = (ROOT / "README.md", ROOT / "notebooks" / "README.md")
MARKERS = re.compile(r"(<!-- binder-badge -->\n).*?(<!-- /binder-badge -->)", re.S)
KEYS = ("Repository", "Source", "Homepage")


def github_path(pyproject=ROOT / "pyproject.toml"):
    """``owner/name`` of the first github.com URL under ``[project.urls]`` (KEYS first), or None."""
    urls = tomllib.loads(Path(pyproject).read_text()).get("project", {}).get("urls", {})
    ordered = [urls[k] for k in KEYS if k in urls] + [u for k, u in urls.items() if k not in KEYS]
    for url in ordered:
        m = re.match(r"https://github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?$", url.strip())
        if m:
            return f"{m[1]}/{m[2]}"
    return None


def badge(path):
    """The Markdown between the markers: the badge for ``path`` (``owner/name``), or nothing without one."""
    if path is None:
        # A maintainer's to-do, not a reader's: it lives in docs/maintainers.md, not in the README's source.
        return ""
    return (f"[![Binder](https://mybinder.org/badge_logo.svg)]"
            f"(https://mybinder.org/v2/gh/{path}/HEAD?urlpath=lab/tree/notebooks)\n")


def main(argv):
    text = badge(github_path())
    stale = []
    for file in FILES:
        old = file.read_text()
        if not MARKERS.search(old):
            sys.exit(f"{file.relative_to(ROOT)}: no <!-- binder-badge --> ... <!-- /binder-badge --> markers")
        new = MARKERS.sub(lambda m: m[1] + text + m[2], old, count=1)
        if new != old:
            stale.append(str(file.relative_to(ROOT)))
            if "--check" not in argv:
                file.write_text(new)
    if "--check" in argv and stale:
        sys.exit(f"the Binder badge of {', '.join(stale)} does not match pyproject.toml: run python binder/badge.py")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
