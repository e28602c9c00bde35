"""bench/records.py and bench/render_results.py: the published numbers are the records' numbers,
a changed source file flags its record, and README carries no figure typed by hand."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import decode_results  # noqa: E402
import provenance  # noqa: E402
import records  # noqa: E402
import render_results  # noqa: E402
import word_problem_seeds  # noqa: E402


def test_every_block_of_every_page_is_what_the_records_render():
    """README.md and docs/*.md hold, between their markers, exactly what the renderers make of
    bench/results/ (run `python bench/render_results.py` after measuring)."""
    recs = records.load_records()
    for page in render_results.pages():
        text = page.read_text()
        assert render_results.render_page(text, recs) == text, (
            f"{page.relative_to(REPO)}: a rendered block differs from its records; run "
            "python bench/render_results.py"
        )


def test_every_record_says_how_it_was_measured():
    """Each record names a command of this repository, a commit, a date, the machine, the
    files it depends on and its results; and every record is shown on some page."""
    recs = records.load_records()
    shown = "".join(page.read_text() for page in render_results.pages())
    used = [n for n in render_results.RENDERERS if f"<!-- results:{n} -->" in shown]
    rendered = set().union(*(_records_read(block, recs) for block in used))
    for name, record in recs.items():
        assert record["command"].startswith("python "), name
        script = record["command"].split()[1]
        assert (REPO / script).is_file(), f"{name}: {script} is not in the repository"
        assert re.fullmatch(r"[0-9a-f]{40}", record["commit"]), name
        assert {"cpu", "cores", "flags", "packages"} <= set(record["machine"]), name
        assert record["depends_on"] and record["results"], name
        assert name in rendered, f"{name}: rendered on no page"


def _records_read(block: str, recs: dict) -> set[str]:
    """The record names a renderer reads, found by running it on a recording dict."""
    seen: set[str] = set()

    class Recording(dict):
        def __getitem__(self, key):
            seen.add(key)
            return super().__getitem__(key)

    with contextlib.suppress(KeyError):
        render_results.RENDERERS[block](Recording(recs))
    return seen


def _record(tmp_path: Path, files: dict[str, str]) -> dict:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    argv = ["bench/train_seeds.py", "x"]
    path = records.write_record("probe", {"x": 1}, ["a.py", "folder"], argv=argv,
                                folder=tmp_path / "results", root=tmp_path)  # fmt: skip
    return json.loads(path.read_text())


def test_a_record_turns_stale_when_a_file_it_depends_on_changes(tmp_path):
    """Unchanged files: nothing stale; an edited file, a new file in a folder it depends on and
    a deleted file are each named."""
    record = _record(tmp_path, {"a.py": "x = 1\n", "folder/b.py": "y = 2\n"})
    assert record["depends_on_paths"] == ["a.py", "folder"]
    assert records.stale(record, tmp_path) == []
    (tmp_path / "a.py").write_text("x = 2\n")
    assert records.stale(record, tmp_path) == ["a.py"]
    (tmp_path / "folder" / "c.py").write_text("z = 3\n")
    (tmp_path / "folder" / "b.py").unlink()
    assert records.stale(record, tmp_path) == ["a.py", "folder/b.py", "folder/c.py"]


def test_a_changed_record_is_not_an_uncommitted_change_of_the_next_measurement():
    """Records rewritten by earlier measurements in the same tree are left out of `dirty`;
    a changed source file, or a file that only looks like a record, is kept."""
    changed = ["bench/results/roofline_gemma.json", "grpo/config.py",
               "bench/results_old.py", "docs/bench/results/x.json"]  # fmt: skip
    assert records.uncommitted(changed) == changed[1:]


def test_comments_docstrings_and_yaml_layout_never_make_a_record_stale(tmp_path):
    """A record goes stale on a change of code or of a config value, and on nothing else: a
    comment, a docstring (module, function or attribute) or YAML layout leaves it standing."""
    record = _record(tmp_path, {"a.py": '"""Doc."""\nx = 1  # one\n',
                                "folder/b.yaml": "k: 1  # one\n"})  # fmt: skip
    (tmp_path / "a.py").write_text('"""Other doc."""\n\n# a comment\nx = 1\n"""attribute doc"""\n')
    (tmp_path / "folder" / "b.yaml").write_text("# header\nk:   1\n")
    assert records.stale(record, tmp_path) == []
    (tmp_path / "a.py").write_text('"""Doc."""\nx = 2\n')
    (tmp_path / "folder" / "b.yaml").write_text("k: 2\n")
    assert records.stale(record, tmp_path) == ["a.py", "folder/b.yaml"]
    (tmp_path / "a.py").write_text('"""Doc."""\nx = "1"\n')  # a string that is a value counts
    assert "a.py" in records.stale(record, tmp_path)


def test_a_byte_digest_record_is_digested_again_only_from_a_clean_commit():
    """An older record (byte digests) is re-digested from its commit's files; one measured
    with uncommitted changes is refused, since its files are in no commit."""
    head = records._git("rev-parse", "HEAD")
    record = {"name": "probe", "commit": head, "dirty": [], "depends_on_paths": ["grpo/config.py"]}
    hashes = records.hashes_at_commit(record)
    data = records.subprocess.run(["git", "show", f"{head}:grpo/config.py"], cwd=records.REPO,
                                  capture_output=True, check=True).stdout  # fmt: skip
    assert hashes == {"grpo/config.py": records.content_digest("grpo/config.py", data)}
    with pytest.raises(ValueError, match="uncommitted"):
        records.hashes_at_commit({**record, "dirty": ["grpo/config.py"]})


def test_a_byte_digest_record_is_digested_again_from_its_checkout_only_if_unchanged(tmp_path):
    """Re-digesting from the tree a record was measured in checks that the tree still holds
    the bytes it measured: a changed file is refused, an unchanged tree gives meaning digests."""
    record = _record(tmp_path, {"a.py": "x = 1\n", "folder/b.py": "y = 2\n"})
    record.update(hashing="bytes", depends_on=records.file_hashes(["a.py", "folder"], tmp_path,
                                                                  "bytes"))  # fmt: skip
    results = tmp_path / "results"
    (results / "probe.json").write_text(json.dumps(record))
    (tmp_path / "a.py").write_text("x = 3\n")
    with pytest.raises(ValueError, match=r"differs from the measured files: \['a.py'\]"):
        records.rehash(["probe"], folder=results, checkout=tmp_path)
    (tmp_path / "a.py").write_text("x = 1\n")
    del record["hashing"]
    (results / "probe.json").write_text(json.dumps(record))
    records.rehash(["probe"], folder=results, checkout=tmp_path)
    rewritten = json.loads((results / "probe.json").read_text())
    assert rewritten["hashing"] == "meaning" and records.stale(rewritten, tmp_path) == []


def test_a_stale_record_is_rendered_with_a_warning_naming_the_files(monkeypatch):
    """`source` names the command and commit, and a stale record's changed files."""
    record = {"command": "python bench/x.py", "commit": "0123456789" * 4, "dirty": [],
              "date": "2026-01-01 00:00 UTC", "depends_on": {}, "depends_on_paths": [],
              "machine": {"cpu": "CPU", "cores": 2, "flags": [], "gpu": None,
                          "packages": {"torch": "2"}}}  # fmt: skip
    assert "Stale" not in provenance.source(record)
    assert "`python bench/x.py` at commit 0123456" in provenance.source(record)
    monkeypatch.setattr(provenance, "stale", lambda r: ["grpo/lm/policy.py"])
    assert "**Stale:** `grpo/lm/policy.py` changed" in provenance.source(record)


def test_only_the_latest_replay_check_is_rendered():
    """A record replayed at several commits shows the latest check, not its history."""
    record = {"command": "python bench/x.py", "commit": "0123456789" * 4, "dirty": [],
              "date": "2026-01-01 00:00 UTC", "depends_on": {}, "depends_on_paths": [],
              "machine": {"cpu": "CPU", "cores": 2, "flags": [], "gpu": None,
                          "packages": {"torch": "2"}},
              "verified": [{"commit": c * 40, "date": d, "seed": 0, "steps": 4, "values": 9,
                            "against": "record"}
                           for c, d in (("a", "2026-01-02 00:00 UTC"), ("b", "2026-01-03 00:00 UTC"))]}  # fmt: skip
    text = provenance.source(record)
    assert "Still current at commit bbbbbbb (2026-01-03)" in text
    assert "aaaaaaa" not in text and text.count("Still current") == 1


def test_an_unknown_block_is_an_error():
    """A marker naming no renderer fails instead of being left as it is."""
    with pytest.raises(KeyError, match="no-such"):
        render_results.render_page("<!-- results:no-such -->\nx\n<!-- /results:no-such -->", {})


MEASURED = re.compile(
    r"\b\d+(?:[.,]\d+)?\s?(?:%|s\b|seconds|minutes|min\b|GiB|MiB|GB|MB|points|x\b|×|tokens/s)"
)


def hand_typed_figures(text: str) -> list[str]:
    """Measured-looking figures (a number with %, s, GiB, x, points ...) outside rendered
    blocks and code: those must come from records."""
    text = render_results.BLOCK.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [m.group(0) for m in MEASURED.finditer(text)]


def test_readme_has_no_hand_typed_measurement():
    """Every measured figure README shows sits in a rendered block."""
    assert hand_typed_figures((REPO / "README.md").read_text()) == []


def test_the_figure_check_can_fail():
    """A percentage or a time typed into prose is found; inside a block or code it is not."""
    text = ("It ends at 89.4 % in 76 s.\n```\n12 s\n```\n"
            "<!-- results:demo-seeds -->\n50 %\n<!-- /results:demo-seeds -->\n")  # fmt: skip
    assert hand_typed_figures(text) == ["89.4 %", "76 s"]


def test_a_block_whose_record_is_missing_says_so_and_shows_no_number():
    """A page never shows a figure without its record: an absent record renders as a line
    naming the file that would hold it."""
    text = "<!-- results:demo-seeds -->\nold 99.9 %\n<!-- /results:demo-seeds -->\n"
    rendered = render_results.render_page(text, {})
    assert "bench/results/demo.json" in rendered and "does not exist yet" in rendered
    assert "99.9" not in rendered


def test_word_problem_seeds_get_a_mean_row_with_their_spread():
    """Two seeds ending at 40 % and 60 % on one split from a 30 % start: the mean row shows
    50.0 %, a +20.0-point change and the seeds' s.d. of that change, sqrt(2) x 10 = 14.1."""
    key = "eval/heldout_numbers/greedy/accuracy"
    start = {"step": 0, "training_seconds": 0.0, key: 0.3}
    runs = [{"seed": seed, "peak_rss_gib": 1.0, "flags": [], "evaluations": [
        start, {"step": 64, "training_seconds": 100.0, key: end}]}
        for seed, end in ((0, 0.4), (1, 0.6))]  # fmt: skip
    text = word_problem_seeds.render({"x": {"results": {"runs": runs}}}, "x", lambda *r: "",
                                     lambda runs: "")
    assert "| mean (± seeds' s.d.) | 64 | | 50.0 % (+20.0 ± 14.1) |" in text
    assert "| 1 | 64 | 100 s | 60.0 % (+30.0) |" in text


def test_word_problem_seeds_that_start_apart_gain_from_their_own_start():
    """Seed 0 starts at 30 % (one CPU), seeds 1 and 2 at 20 % (another): two start rows, and
    each change is from the seed's own start: 40 % is +10.0 for seed 0 but +20.0 for seed 1;
    the mean change of +10, +20 and +30 is +20.0 with s.d. 10.0."""
    key = "eval/heldout_numbers/greedy/accuracy"
    runs = [{"seed": seed, "peak_rss_gib": 1.0, "flags": [], "evaluations": [
        {"step": 0, "training_seconds": 0.0, key: start},
        {"step": 64, "training_seconds": 100.0, key: end}]}
        for seed, start, end in ((0, 0.3, 0.4), (1, 0.2, 0.4), (2, 0.2, 0.5))]  # fmt: skip
    text = word_problem_seeds.render({"x": {"results": {"runs": runs}}}, "x", lambda *r: "",
                                     lambda runs: "")
    assert "| 0 | 0 | 0 s | 30.0 % |" in text and "| 1, 2 | 0 | 0 s | 20.0 % |" in text
    assert "| all |" not in text
    assert "| 0 | 64 | 100 s | 40.0 % (+10.0) |" in text
    assert "| 1 | 64 | 100 s | 40.0 % (+20.0) |" in text
    assert "| mean (± seeds' s.d.) | 64 | | 43.3 % (+20.0 ± 10.0) |" in text


def test_seeds_added_later_say_when_each_ran(monkeypatch):
    """A record joined by `train_seeds.py --add-to` names each seed's commit and date."""
    monkeypatch.setattr(provenance, "stale", lambda record: [])
    record = {"command": "python bench/train_seeds.py c.yaml --name x --seeds 0 1 2",
              "commit": "b" * 40, "date": "2026-12-05 09:00 UTC", "dirty": [],
              "machine": {"cpu": "cpu", "cores": 2, "flags": [], "gpu": None, "packages": {}},
              "results": {"runs": [
                  {"seed": 0, "commit": "a" * 40, "date": "2026-12-04 19:00 UTC"},
                  {"seed": 1, "commit": "b" * 40, "date": "2026-12-05 09:00 UTC"},
                  {"seed": 2, "commit": "b" * 40, "date": "2026-12-05 09:00 UTC"}]}}  # fmt: skip
    text = provenance.source(record)
    assert ("seed 0 at commit aaaaaaa, 2026-12-04 19:00 UTC; seeds 1, 2 at commit bbbbbbb, "
            "2026-12-05 09:00 UTC.") in text


def test_the_lean_engine_on_gemma_is_shown_as_a_ratio_to_the_transformers_engine():
    """15 tokens/s against 10: lean's row says 1.50, the transformers engine's 1.00."""
    run = {"rollout_s": 64.0, "mean_completion_tokens": 64.0}
    results = {"gemma-transformers": {**run, "rollout_tokens_per_s": 10.0},
               "gemma-lean": {**run, "rollout_tokens_per_s": 15.0}}  # fmt: skip
    text = decode_results.lean_gemma({"lean_gemma_rollout": {"results": results}}, lambda r: "")
    assert "| transformers | 10.0 | 64.0 | 64.0 | 1.00 |" in text
    assert "| lean | 15.0 | 64.0 | 64.0 | 1.50 |" in text


def test_the_summary_names_every_machine_and_commit_its_seeds_ran_on(monkeypatch):
    """Seed 0 on one CPU at commit aaaaaaa, seeds 1 and 2 on another at bbbbbbb: the README's
    `when, where` cell names both, each with its seeds, not only the record's own machine."""
    monkeypatch.setattr(render_results, "stale", lambda record: [])
    cpu = {"cores": 2, "flags": [], "gpu": None, "packages": {"torch": "2", "trl": "1"}}
    first, second = {**cpu, "cpu": "CPU A"}, {**cpu, "cpu": "CPU B"}
    key = "eval/heldout_numbers/greedy/accuracy"
    evaluations = [{"step": 0, "training_seconds": 0.0, key: 0.2},
                   {"step": 8, "training_seconds": 9.0, key: 0.4}]  # fmt: skip
    runs = [{"seed": 0, "commit": "a" * 40, "date": "2026-12-04 19:00 UTC", "machine": first},
            *({"seed": s, "commit": "b" * 40, "date": "2026-12-05 09:00 UTC", "machine": second}
              for s in (1, 2))]  # fmt: skip
    record = {"commit": "b" * 40, "date": "2026-12-05 09:00 UTC", "machine": second,
              "results": {"runs": [{**run, "evaluations": evaluations} for run in runs]}}  # fmt: skip
    row = next(line for line in render_results.summary({"smollm2_math": record}).splitlines()
               if "smollm2_math.yaml`): held-out" in line)  # fmt: skip
    assert ("| 2026-12-04 to 2026-12-05, CPU A (seed 0, commit aaaaaaa); CPU B (seeds 1, 2, "
            "commit bbbbbbb); torch 2, trl 1 |") in row
    one = {**record, "results": {"runs": [{**run, "evaluations": evaluations} for run in runs[1:]]}}
    assert provenance.when_where(one) == "2026-12-05, CPU B (2 cores, no AVX-512); torch 2, trl 1, commit bbbbbbb"


def test_the_summary_of_a_trl_comparison_gives_each_librarys_steps():
    """grpo ran 1000 steps of 0.1 s and TRL 500 of 0.4 s: the row says both step counts beside
    the 0.25x step time, since the two libraries did not run the same schedule."""
    summary = {"grpo": {"steps": 1000, "seconds_per_step": 0.1},
               "trl": {"steps": 500, "seconds_per_step": 0.4}, "ratio_to_trl_run": 0.5}  # fmt: skip
    assert render_results._vs_trl({"results": {"summary": summary}}) == (
        "grpo 1000 steps, TRL 500: a grpo step takes 0.25x a TRL step; grpo reaches TRL's final "
        "figure in 0.50x TRL's training time")


def test_a_trl_comparison_where_trl_did_not_improve_compares_equal_training_time(monkeypatch):
    """TRL went from 8 % to 6 %: both libraries "reach" 6 % at 0 s, so no time is shown (not a
    0 s that reads as instant), and the accuracies after equal training time are given instead."""
    summary = {
        "grpo": {"steps": 64, "seconds_per_step": 17.0, "seconds": 1100.0, "final_accuracy": 0.38,
                 "finals": [0.38], "time_to_trl_final": 0.0, "peak_rss_gib": 8.0,
                 "accuracy_at": {"0.25": 0.08, "0.5": 0.26, "1": 0.38}},
        "trl": {"steps": 8, "seconds_per_step": 250.0, "seconds": 2000.0, "final_accuracy": 0.06,
                "finals": [0.06], "time_to_trl_final": 0.0, "peak_rss_gib": 10.0,
                "accuracy_at": {"0.25": 0.08, "0.5": 0.08, "1": 0.06}},
        "trl_start": 0.08, "ratio_to_trl_run": None,
    }  # fmt: skip
    record = {"results": {"summary": summary}}
    monkeypatch.setattr(render_results, "source", lambda *records: "")  # no provenance here
    assert render_results._vs_trl(record) == (
        "grpo 64 steps, TRL 8: a grpo step takes 0.07x a TRL step; TRL ended no higher than it "
        "started; after TRL's training time grpo's figure is 0.38, TRL's 0.06")
    rows, text = render_results.trl_comparison("x")({"x": record}).split("\n\n")[:2]
    assert "| 0 s |" not in rows and rows.count("| - |") == 2
    assert "TRL ended no higher than it started (8.0 %)" in text
    assert "all of TRL's 2000 s of training: grpo 8.0 % / 26.0 % / 38.0 %, TRL 8.0 % / 8.0 % / 6.0 %" in text


def test_the_summary_of_word_problem_seeds_gives_each_splits_change_from_each_seeds_start():
    """Seed 0 goes 30 -> 40 % on new numbers and 10 -> 20 % on the bare question, seed 1
    (starting elsewhere) 20 -> 40 % and 20 -> 20 %: mean changes +15.0 (s.d. 7.1 = 5 sqrt 2)
    and +5.0 (s.d. 7.1); the longest training is seed 1's 130 s."""
    numbers, bare = "eval/heldout_numbers/greedy/accuracy", "eval/heldout_bare/greedy/accuracy"
    runs = [{"seed": seed, "evaluations": [
        {"step": 0, "training_seconds": 0.0, numbers: n0, bare: b0},
        {"step": 64, "training_seconds": seconds, numbers: n1, bare: b1}]}
        for seed, n0, n1, b0, b1, seconds in ((0, 0.3, 0.4, 0.1, 0.2, 120.0),
                                              (1, 0.2, 0.4, 0.2, 0.2, 130.0))]  # fmt: skip
    text = word_problem_seeds.summary({"results": {"runs": runs}})
    assert text == ("points gained by step 64 (mean ± s.d. of 2 seeds): new numbers +15.0 ± 7.1, "
                    "bare question +5.0 ± 7.1; 130 s of training at most")
    one = word_problem_seeds.summary({"results": {"runs": runs[:1]}})
    assert one.startswith("points gained by step 64 (1 seed): new numbers +10.0, bare question +10.0;")


def test_the_demo_on_each_cpu_gives_seed_0s_accuracy_and_every_seeds(monkeypatch):
    """Records of the demo as shipped: CPU A's seeds 0-2, CPU B's seed 0 and, joined to CPU A's
    record later (`--add-to`), CPU B's seed 1 become a row per CPU, each seed under the CPU it
    ran on; the demo with overrides, another experiment, is left out; no record says so."""
    monkeypatch.setattr(render_results, "source", lambda *records: "SOURCES")
    a, b = {"cpu": "CPU A", "flags": ["avx2", "avx512f"]}, {"cpu": "CPU B", "flags": ["avx2"]}

    def run(seed, final, **stamp):
        return {"seed": seed, **stamp, "evaluations": [
            {"step": 0, "eval/greedy/accuracy": 0.306},
            {"step": 1000, "eval/greedy/accuracy": final}]}  # fmt: skip

    def record(name, date, machine, runs, overrides=()):
        return {"name": name, "date": date, "commit": "c" * 40, "machine": machine,
                "command": f"python bench/train_seeds.py configs/demo.yaml --name {name}",
                "results": {"config": "configs/demo.yaml", "overrides": list(overrides),
                            "runs": runs}}  # fmt: skip

    joined = run(1, 0.842, commit="d" * 40, date="2026-12-08", machine=b)
    records = {"b": record("b", "2026-12-07", b, [run(0, 0.874)]),
               "a": record("a", "2026-12-04", a, [run(0, 0.86), run(2, 0.864), run(1, 0.858),
                                                   joined]),
               "c": record("c", "2026-12-05", b, [run(0, 0.5)], overrides=["seed=3"])}
    assert render_results.demo_cpus(records).splitlines() == [
        "| CPU | before | after, seed 0 | after, every seed |", "|---|---|---|---|",
        "| CPU A (avx2, avx512f) | 30.6 % | 86.0 % | 86.0, 85.8, 86.4 % |",
        "| CPU B (avx2) | 30.6 % | 87.4 % | 87.4, 84.2 % |", "", "SOURCES"]
    assert render_results.demo_cpus({"c": records["c"]}).startswith("No record of the demo yet")
