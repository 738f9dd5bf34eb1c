"""`dvc plots show/diff` pages render offline: the workspace's ``plots.html_template`` (.dvc/config)
inlines the vendored vega, vega-lite and vega-embed builds (vendor/vega/), so the written page loads
nothing from a CDN."""

import importlib.util
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

from configobj import ConfigObj

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "vendor" / "vega"
REMOTE = re.compile(r"""\b(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


def _make_template():
    spec = importlib.util.spec_from_file_location("make_template", VENDOR / "make_template.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Refs(HTMLParser):
    """Every src/href attribute of the page's tags (script bodies are not parsed as tags)."""

    def __init__(self):
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        self.refs += [(tag, k, v or "") for k, v in attrs if k in ("src", "href")]


def _dvc(*args, cwd, env):
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=120
    )


def test_dvc_plots_show_page_loads_nothing_remote(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DVC_")}
    env.update(DVC_NO_ANALYTICS="1", DVC_SITE_CACHE_DIR=str(tmp_path / "site"))
    r = _dvc("init", "--no-scm", cwd=repo, env=env)
    assert r.returncode == 0, r.stderr
    # the workspace's template setting, resolved as DVC resolves it (relative to .dvc/)
    template = ConfigObj(str(ROOT / ".dvc" / "config")).get("plots", {}).get("html_template")
    if template:
        with open(repo / ".dvc" / "config", "a", encoding="utf-8") as f:
            f.write(f"[plots]\n    html_template = {(ROOT / '.dvc' / template).resolve()}\n")
    (repo / "lat.csv").write_text("batch,latency_us\n1,2.0\n8,3.5\n64,-1.25\n", encoding="utf-8")

    r = _dvc("plots", "show", "lat.csv", "-x", "batch", "-y", "latency_us", "-o", "out", cwd=repo, env=env)
    assert r.returncode == 0, r.stderr
    page = (repo / "out" / "index.html").read_text(encoding="utf-8")

    assert "cdn" not in page.lower(), "the page loads vega from a CDN: blank without network"
    assert not REMOTE.search(page), REMOTE.search(page).group(0)
    parser = _Refs()
    parser.feed(page)
    assert not parser.refs, f"the page references files: {parser.refs}"
    # ...and still draws: the plot is there, and each vendored build is inlined (utf-8: vega formats
    # negative numbers with U+2212, which a page without a charset shows as mojibake)
    assert "vegaEmbed('#" in page and "latency_us" in page
    assert '<meta charset="utf-8">' in page
    mt = _make_template()
    for name in mt.BUILDS:
        js = (VENDOR / name).read_text(encoding="utf-8")
        assert js[:2000] in page and js.rstrip().splitlines()[0][-2000:] in page, f"{name} is not inlined"


def test_template_is_current_with_the_vendored_builds():
    """Replacing a vendored file without rerunning make_template.py would leave the old build inlined."""
    mt = _make_template()
    assert mt.TEMPLATE.read_text(encoding="utf-8") == mt.render(), "run: python vendor/vega/make_template.py"
    assert ConfigObj(str(ROOT / ".dvc" / "config"))["plots"]["html_template"] == "../vendor/vega/plots.html"


def test_readme_says_the_plots_render_offline_and_how():
    """The Compare section names the template .dvc/config sets, so moving it leaves no stale README."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    compare = readme.split("## Compare", 1)[1].split("\n## ", 1)[0]
    template = ConfigObj(str(ROOT / ".dvc" / "config")).get("plots", {}).get("html_template")
    assert template, "no plots.html_template in .dvc/config"
    shown = (ROOT / ".dvc" / template).resolve().relative_to(ROOT).as_posix()
    assert "offline" in compare and "plots.html_template" in compare and shown in compare


def test_every_dvc_plot_says_where_its_device_is_named():
    """The dvc plots' titles did not say that a CPU run's figures are interpreter timings; each plotted CSV carries a
    device column (cuda or cpu), and each title now points to it."""
    import csv

    import yaml

    plots = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    committed = ROOT / "reports" / "campaigns" / "kernel_speed" / "k16_tp8"  # a benchmark stage's own outputs
    for plot in plots:
        ((title, spec),) = plot.items()
        assert "GPU or CPU" in title and "the device column says" in title, title
        for path in spec["y"]:
            with open(committed / Path(path).name, newline="") as f:
                assert "device" in next(csv.reader(f)), (title, path)
