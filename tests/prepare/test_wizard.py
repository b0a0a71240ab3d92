"""Without --non-interactive, prepare asks energon's questions in energon's order; answers come on stdin."""

from __future__ import annotations

from pathlib import Path

import yaml

from prep.index.dataset_yaml import sample_types
from tests.support.prepare import assert_same_index, run_energon_prepare, run_shardprep, snapshot, twin
from tests.support.shards import sample_members, write_tarfile


def choice(class_name: str) -> str:
    return str([t.class_name for t in sample_types()].index(class_name))


def make_dataset(root: Path) -> Path:
    for n in range(4):
        write_tarfile(root / f"part-{n}.tar", sample_members(f"p{n}-", 6))
    return root


def test_field_map_questions_match_energon_and_write_the_same_files(tmp_path: Path) -> None:
    ours = make_dataset(tmp_path / "wizard")
    theirs = twin(ours, "wizard-energon")
    # split; create dataset.yaml?; sample type; field map (not sample loader)?; field 'text' (a wrong part first)
    answers = f"8,1,1\ny\n{choice('TextSample')}\ny\njpg\ntxt\n"
    result = run_shardprep("prepare", str(ours), "--no-progress", input=answers)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    order = [
        'Please enter a desired train/val/test split like "0.5, 0.2, 0.3" or "8,1,1"',
        "Sample 0, keys:",
        "Found the following part types in the dataset: json, txt",
        "Do you want to create a dataset.yaml interactively?",
        "The following sample types are available:",
        f"{choice('CrudeWebdataset')}. Crude sample (plain dict for cooking)",
        "Please enter a number to choose a class",
        "Do you want to set a simple field_map[Y] (or write your own sample_loader [n])?",
        "Please enter a webdataset field name for 'text' (<class 'str'>)",  # str(field.type), as energon
        "That type doesn't exist in the WebDataset. Please try again.",
    ]
    positions = [out.index(text) for text in order]
    assert positions == sorted(positions), out
    run_energon_prepare(str(theirs), "--no-progress", input=answers)
    assert_same_index(ours, theirs)
    assert yaml.safe_load((ours / ".nv-meta" / "dataset.yaml").read_text())["field_map"] == {"text": "txt"}


def test_an_empty_field_map_is_written_as_energon_writes_it_not_as_a_sample_loader(tmp_path: Path) -> None:
    """`--field-map '{}'`, or a field map asked for a type without fields (Sample): `field_map: {}`."""
    ours = make_dataset(tmp_path / "empty-map")
    theirs = twin(ours, "empty-map-energon")
    flags = ["--non-interactive", "--no-progress", "--split-ratio", "1,0,0", "--sample-type", "TextSample"]
    run_shardprep("prepare", str(ours), *flags, "--field-map", "{}", check=True)
    run_energon_prepare(str(theirs), *flags, "--field-map", "{}")
    assert_same_index(ours, theirs)
    assert "field_map: {}" in (ours / ".nv-meta" / "dataset.yaml").read_text()
    assert not (ours / ".nv-meta" / "sample_loader.py").exists()
    # interactively: continue; split; create dataset.yaml; Sample; a field map (of no fields)
    answers = f"y\n1,0,0\ny\n{choice('Sample')}\ny\n"
    run_shardprep("prepare", str(ours), "--no-progress", input=answers, check=True)
    run_energon_prepare(str(theirs), "--no-progress", input=answers)
    assert_same_index(ours, theirs)
    assert "field_map: {}" in (ours / ".nv-meta" / "dataset.yaml").read_text()


def test_the_wizard_takes_the_answers_energon_takes(tmp_path: Path) -> None:
    """Driven by the same keystrokes, both end with the same dataset.yaml: a negative class number counts
    from the end of the list (-1: crude), and a field answer is checked as typed (" txt" is asked again)."""
    ours = make_dataset(tmp_path / "answers")
    theirs = twin(ours, "answers-energon")
    run_shardprep("prepare", str(ours), "--no-progress", input="8,1,1\ny\n-1\n", check=True)
    run_energon_prepare(str(theirs), "--no-progress", input="8,1,1\ny\n-1\n")
    assert_same_index(ours, theirs)
    assert yaml.safe_load((ours / ".nv-meta" / "dataset.yaml").read_text())["__class__"] == "CrudeWebdataset"
    # continue; split; create; TextSample counted from the end; field map; " txt" (refused), then "txt"
    answers = f"y\n8,1,1\ny\n{int(choice('TextSample')) - len(sample_types())}\ny\n txt\ntxt\n"
    result = run_shardprep("prepare", str(ours), "--no-progress", input=answers, check=True)
    energon = run_energon_prepare(str(theirs), "--no-progress", input=answers)
    assert_same_index(ours, theirs)
    assert yaml.safe_load((ours / ".nv-meta" / "dataset.yaml").read_text())["field_map"] == {"text": "txt"}
    refused = "That type doesn't exist in the WebDataset. Please try again."
    assert result.stdout.count(refused) == energon.stdout.count(refused) == 1


def test_declining_to_continue_over_an_existing_index_changes_nothing(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "again")
    first = run_shardprep(
        "prepare", str(root), "--no-progress", input=f"8,1,1\ny\n{choice('CrudeWebdataset')}\n"
    )
    assert first.returncode == 0, first.stderr
    before = snapshot(root)
    second = run_shardprep("prepare", str(root), "--no-progress", input="n\n")
    assert "It seems the dataset had already been prepared. Do you want to continue?" in second.stdout
    assert second.returncode == 0
    assert snapshot(root) == before


def test_sample_loader_path_keeps_an_edited_loader_unless_told(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "loader")
    answers = f"8,1,1\ny\n{choice('TextSample')}\nn\n"
    result = run_shardprep("prepare", str(root), "--no-progress", input=answers)
    assert result.returncode == 0, result.stderr
    loader = root / ".nv-meta" / "sample_loader.py"
    definition = yaml.safe_load((root / ".nv-meta" / "dataset.yaml").read_text())
    assert definition["sample_loader"] == "sample_loader.py:sample_loader"
    assert definition["part_filter"] == "sample_loader.py:part_filter"
    loader.write_text(loader.read_text().replace('raw["TODO"]', 'raw["txt"]'))
    edited = loader.read_text()
    # continue?; split; create yaml?; type; field map? no; override the existing loader? no
    again = run_shardprep(
        "prepare", str(root), "--no-progress", input=f"y\n8,1,1\ny\n{choice('TextSample')}\nn\nn\n"
    )
    assert again.returncode == 0, again.stderr
    assert "Do you want to override the existing sample loader?" in again.stdout
    assert loader.read_text() == edited


def test_non_interactive_refuses_a_prepared_dataset_without_force(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "force")
    flags = ["--non-interactive", "--no-progress", "--split-ratio", "1,0,0", "--crude"]
    assert run_shardprep("prepare", str(root), *flags).returncode == 0
    refused = run_shardprep("prepare", str(root), *flags)
    assert refused.returncode != 0 and "--force-overwrite" in refused.stderr
    assert run_shardprep("prepare", str(root), *flags, "--force-overwrite").returncode == 0


def test_non_interactive_needs_a_split(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "nosplit")
    result = run_shardprep("prepare", str(root), "--non-interactive", "--no-progress")
    assert result.returncode != 0 and "--split-ratio is required" in result.stderr
    assert not (root / ".nv-meta").exists()


def test_unknown_sample_type_lists_the_known_ones(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "badtype")
    result = run_shardprep(
        "prepare", str(root), "--non-interactive", "--split-ratio", "1,0,0", "--sample-type", "Nope"
    )
    assert (
        result.returncode != 0 and "CaptioningSample" in result.stderr and "CrudeWebdataset" in result.stderr
    )


def test_run_abandoned_at_a_question_after_indexing_leaves_the_old_index(tmp_path: Path) -> None:
    """The new index is staged when the dataset.yaml questions come; walking away there discards it."""
    root = make_dataset(tmp_path / "abandon")
    first = run_shardprep(
        "prepare", str(root), "--no-progress", input=f"8,1,1\ny\n{choice('CrudeWebdataset')}\n"
    )
    assert first.returncode == 0, first.stderr
    write_tarfile(root / "part-9.tar", sample_members("p9-", 3))  # would change the index
    before = snapshot(root)
    abandoned = run_shardprep("prepare", str(root), "--no-progress", input="y\n8,1,1\n")  # stdin ends here
    assert abandoned.returncode != 0
    assert "Do you want to create a dataset.yaml interactively?" in abandoned.stdout
    assert snapshot(root) == before
