"""The figures in README.md and docs/*.md are the results files' (scripts/figures.py): a page that says another
number than its file fails here, and so does a measured figure left outside a span, a results file of another
checkpoint than the served one, and a README line over 300 characters."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_script():
    spec = importlib.util.spec_from_file_location("figures", ROOT / "scripts" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["figures"] = module  # the registry imports its helpers from here
    spec.loader.exec_module(module)
    return module


fg = _load_script()


def _report(problems) -> str:
    return "\n".join(map(str, problems)) + f"\n(fix a figure that differs with `{fg.WRITE_HINT}`)"


def test_every_page_figure_is_its_results_file():
    results = fg.Results()
    problems = fg.check_spans(results)
    assert not problems, _report(problems)
    # the check covers what it should: the README and every user page, not docs/research/
    pages = {str(p.relative_to(ROOT)) for p in fg.pages()}
    assert "README.md" in pages and "docs/operations.md" in pages and "docs/privacy.md" in pages
    assert not any(p.startswith("docs/research/") for p in pages)
    assert len([s for p in fg.pages() for s in fg.spans(p)]) >= 100


def test_no_measured_figure_outside_a_span():
    problems = fg.unbound()
    assert not problems, _report(problems)


def test_results_files_are_the_served_checkpoints():
    problems = fg.checkpoint_problems(fg.Results())
    assert not problems, "\n".join(problems)


def test_readme_lines_fit():
    problems = fg.long_lines()
    assert not problems, _report(problems)


def test_every_registered_figure_resolves():
    results = fg.Results()
    for key in results.figures:
        assert results.value(key), key


def _copy_pages(tmp_path: Path) -> Path:
    """A scratch repository: the pages, the results files and the served config (what the checks read)."""
    for page in fg.pages():
        dest = tmp_path / page.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(page, dest)
    shutil.copytree(ROOT / fg.RESULTS, tmp_path / fg.RESULTS)
    (tmp_path / fg.SERVED_CONFIG).parent.mkdir(parents=True)
    shutil.copy(ROOT / fg.SERVED_CONFIG, tmp_path / fg.SERVED_CONFIG)
    return tmp_path


def test_a_planted_readme_figure_fails_and_write_restores_it(tmp_path):
    root = _copy_pages(tmp_path)
    readme = root / "README.md"
    good = readme.read_text()
    span = "<!-- fig:f8k.temde.r1 -->22.18<!-- /fig -->"
    assert span in good, "the README states the served T-EMDE R@1 (its first screen)"
    readme.write_text(good.replace(span, "<!-- fig:f8k.temde.r1 -->23.18<!-- /fig -->", 1))
    results = fg.Results(root)
    problems = fg.check_spans(results)
    assert [(p.page, p.key) for p in problems] == [("README.md", "f8k.temde.r1")]
    msg = str(problems[0])
    assert "'23.18'" in msg and "'22.18'" in msg and "region_served_test.json" in msg, msg
    print("\nthe planted edit gives:\n" + msg)
    assert fg.write(results) == [readme]
    assert readme.read_text() == good


def test_a_block_figure_fails_with_a_diff(tmp_path):
    root = _copy_pages(tmp_path)
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("CP 22.16 / 64.92", "CP 22.84 / 64.78", 1))
    problems = fg.check_spans(fg.Results(root))
    assert [(p.page, p.key) for p in problems] == [("README.md", "readme.results")]
    assert "-| Flickr8k test" in problems[0].message and "CP 22.16 / 64.92" in problems[0].message


def test_a_new_measurement_reaches_the_pages(tmp_path):
    """A benchmark rewriting its file makes the pages stale until --write, which puts the new number everywhere."""
    root = _copy_pages(tmp_path)
    f = root / fg.RESULTS / "region_served_test.json"
    data = json.loads(f.read_text())
    data["t2i"]["TEMDE@100"]["R@1"] = 23.5
    f.write_text(json.dumps(data))
    results = fg.Results(root)
    stale = {(p.page, p.key) for p in fg.check_spans(results)}
    assert ("README.md", "f8k.temde.r1") in stale and ("docs/models.md", "f8k.temde.r1") in stale
    assert ("README.md", "readme.results") in stale
    fg.write(results)
    assert not fg.check_spans(fg.Results(root))
    assert "<!-- fig:f8k.temde.r1 -->23.50<!-- /fig -->" in (root / "README.md").read_text()


def test_another_checkpoints_results_are_refused(tmp_path):
    root = _copy_pages(tmp_path)
    f = root / fg.RESULTS / "region_served_test.json"
    data = json.loads(f.read_text())
    data["model_fingerprint"] = "0123456789abcdef"
    f.write_text(json.dumps(data))
    problems = fg.checkpoint_problems(fg.Results(root))
    assert len(problems) == 1 and "region_served_test.json records checkpoint 0123456789abcdef" in problems[0]


def test_a_file_keyed_by_checkpoint_has_no_figure_for_another(tmp_path):
    """latency_region.json holds timings per checkpoint: serving a new one leaves its figures unresolved, not old."""
    root = _copy_pages(tmp_path)
    cfg = root / fg.SERVED_CONFIG
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "fingerprint": "0123456789abcdef"}))
    with pytest.raises(fg.FigureError, match="the served checkpoint is 0123456789abcdef"):
        fg.Results(root).value("lat.100k.temde.p50")


def test_unbound_figures_and_long_lines_are_found(tmp_path):
    root = _copy_pages(tmp_path)
    readme = root / "README.md"
    readme.write_text(readme.read_text() + "\nSearches take 12.5 ms on my laptop.\n\n```\n9.9 ms in a code block\n```\n"
                      + "| " + "x" * 310 + " |\n")
    found = fg.unbound(root)
    assert [(p.page, p.key) for p in found] == [("README.md", "12.5 ms")]
    assert [p.key for p in fg.long_lines(root)] == ["line"]


@pytest.mark.parametrize("machine, short", [
    ("2 cores (Intel(R) Xeon(R) Processor), 24 GiB RAM, no GPU, Linux x86_64", "2-core Intel Xeon"),
    ("2 cores (AMD EPYC), 24 GiB RAM, no GPU", "2-core AMD EPYC"),
    ("2 cores AMD EPYC, no GPU, Linux 6.18.44-fc-v509", "2-core AMD EPYC"),
    ({"cpu": "Intel(R) Xeon(R) Processor", "cores": 2}, "2-core Intel Xeon"),
])
def test_hosts_read_from_machine_records(machine, short):
    assert fg.short_host(machine) == short
