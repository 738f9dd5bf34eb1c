"""Write ``plots.html``: the page template ``dvc plots show/diff`` fill (``plots.html_template`` in
``.dvc/config``), with the vendored vega, vega-lite and vega-embed builds inlined so the page renders
without network.

    python vendor/vega/make_template.py            # after replacing a vendored file (then commit both)
    python vendor/vega/make_template.py --check    # exit 1 when plots.html differs from what it would write

DVC replaces ``{plot_divs}`` (the plots) and ``{refresh_tag}`` in the template and ``{scripts}``, its
CDN ``<script src=...>`` tags, only where the template has that placeholder: this one has none.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "plots.html"
# file -> (package, version): the npm package each build/*.min.js comes from (see README.md)
BUILDS = {
    "vega.min.js": ("vega", "5.33.1"),
    "vega-lite.min.js": ("vega-lite", "5.23.0"),
    "vega-embed.min.js": ("vega-embed", "6.29.0"),
}
# DVC's placeholders: a vendored file must not contain them (DVC would substitute inside the script)
PLACEHOLDERS = ("{scripts}", "{plot_divs}", "{refresh_tag}")

PAGE = """<!DOCTYPE html>
<html>
<head>
    <meta charset="utf-8">
    {refresh_tag}
    <title>DVC Plot</title>
    <!-- Offline page (kernelcamp vendor/vega/, written by make_template.py: do not edit by hand).
         Inlined: @BUILDS@ (BSD-3-Clause, see vendor/vega/LICENSE.*). -->
@SCRIPTS@
    <style>
        table {
            border-spacing: 15px;
        }
    </style>
</head>
<body>
    {plot_divs}
</body>
</html>
"""


def render(folder: Path = HERE) -> str:
    """The template text for the builds in ``folder``."""
    scripts = []
    for name, (package, version) in BUILDS.items():
        js = (folder / name).read_text(encoding="utf-8")
        low = js.lower()
        if "</script" in low or "<!--" in low or any(p in js for p in PLACEHOLDERS):
            raise ValueError(f"{name} contains '</script', '<!--' or a DVC placeholder: it cannot be inlined")
        if f'"{version}"' not in js:
            raise ValueError(f"{name} does not say version {version}: update BUILDS and README.md")
        # the source map is not vendored: drop its reference (a devtools 404 otherwise)
        body = "\n".join(line for line in js.rstrip().splitlines() if not line.startswith("//# sourceMappingURL="))
        scripts.append(f'    <script type="text/javascript">/* {package} {version}: {name} */\n{body}\n    </script>')
    names = ", ".join(f"{p} {v}" for p, v in BUILDS.values())
    return PAGE.replace("@BUILDS@", names).replace("@SCRIPTS@", "\n".join(scripts))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = TEMPLATE.read_text(encoding="utf-8") if TEMPLATE.is_file() else None
        if current != text:
            print(f"{TEMPLATE} is out of date: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TEMPLATE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
