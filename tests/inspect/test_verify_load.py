"""`shardprep verify --load`: every sample loaded through dataset.yaml finds what `energon lint` finds.

The datasets hold real JPEGs (one cut short), JSON parts (one not JSON, one without the field the field
map reads) and a sample without a part the field map names; they are prepared by `shardprep prepare`
and checked by the real `energon lint` (megatron-energon 7.4.1) beside ours. energon 7.4.1's lint logs
each failing sample and carries on (its exit code stays 0), so its findings are read from its log.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support.prepare import REPO, run_energon, run_shardprep
from tests.support.shards import write_webdataset

CAPTION_FROM_JSON = '{"image": "jpg", "caption": "json[caption]"}'
SAMPLE_LOADER = """
def sample_loader(raw: dict) -> dict:
    return {"text": raw["json"]["caption"]}


def part_filter(part: str) -> bool:
    return part == "json"
"""


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (12, 16, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def _broken_samples(shard: int) -> list[dict]:
    """Eight samples of jpg, json and txt parts; shard 0 has invalid JSON, shard 1 a truncated JPEG,
    shard 2 a JSON part without `caption` and a sample without its jpg."""
    samples = []
    for index in range(8):
        sample = {
            "__key__": f"s{shard}_{index:03d}",
            "jpg": _jpeg(shard * 10 + index),
            "json": json.dumps({"caption": f"caption {index}"}).encode(),
            "txt": f"text {index}".encode(),
        }
        if (shard, index) == (0, 5):
            sample["json"] = b'{"caption": "unterminated'
        if (shard, index) == (1, 3):
            sample["jpg"] = sample["jpg"][: len(sample["jpg"]) // 3]
        if (shard, index) == (2, 1):
            sample["json"] = b'{"title": "no caption"}'
        if (shard, index) == (2, 6):
            del sample["jpg"]
        samples.append(sample)
    return samples


def _dataset(folder: Path, *flags: str) -> Path:
    for shard in range(3):
        write_webdataset(folder / f"shard-{shard}.tar", _broken_samples(shard))
    run_shardprep("prepare", str(folder), "--non-interactive", "--split-ratio", "1,0,0", *flags, check=True)
    return folder


@pytest.fixture(scope="module")
def field_map_dataset(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("load") / "field-map"
    return _dataset(folder, "--sample-type", "CaptioningSample", "--field-map", CAPTION_FROM_JSON)


@pytest.fixture(scope="module")
def crude_dataset(tmp_path_factory) -> Path:
    return _dataset(tmp_path_factory.mktemp("load") / "crude", "--sample-type", "CrudeWebdataset")


@pytest.fixture(scope="module")
def sample_loader_dataset(tmp_path_factory) -> Path:
    folder = _dataset(tmp_path_factory.mktemp("load") / "loader", "--sample-type", "CrudeWebdataset")
    meta = folder / ".nv-meta"
    (meta / "sample_loader.py").write_text(SAMPLE_LOADER)
    (meta / "dataset.yaml").write_text(
        "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\n"
        "sample_loader: sample_loader.py:sample_loader\npart_filter: sample_loader.py:part_filter\n"
    )
    return folder


def energon_lint_failures(dataset: Path) -> set[str]:
    """The keys of the samples `energon lint` logs as failing."""
    result = run_energon("lint", str(dataset), timeout=120, cwd=dataset, check=False)
    log = result.stdout + result.stderr
    assert "Checking the index files" in log, log
    return set(re.findall(r"^\s*- __key__: (\S+)$", log, flags=re.MULTILINE))


def verify_load(dataset: Path, *flags: str) -> tuple[int, dict]:
    result = run_shardprep("verify", str(dataset), "--load", "--json", "--num-workers", "2", *flags)
    assert result.stdout.startswith("{"), result.stdout + result.stderr
    return result.returncode, json.loads(result.stdout)


def failing(report: dict) -> dict[str, str]:
    """shard/key[.part] -> what, of every problem."""
    return {problem["where"]: problem["what"] for problem in report["problems"]}


def test_field_map_dataset_fails_on_the_samples_energon_lint_names(field_map_dataset):
    code, report = verify_load(field_map_dataset)
    found = failing(report)
    assert code == 1 and report["loaded"] == 24
    assert set(found) == {
        "shard-0.tar/s0_005.json",
        "shard-1.tar/s1_003.jpg",
        "shard-2.tar/s2_001.json",
        "shard-2.tar/s2_006.jpg",
    }
    assert "JSONDecodeError" in found["shard-0.tar/s0_005.json"]
    assert "OSError" in found["shard-1.tar/s1_003.jpg"]
    assert "FieldAccessError" in found["shard-2.tar/s2_001.json"]
    assert "has no part 'jpg'" in found["shard-2.tar/s2_006.jpg"]
    ours = {where.split("/")[1].split(".")[0] for where in found}
    assert ours == energon_lint_failures(field_map_dataset)


def test_sample_loader_dataset_fails_on_the_samples_energon_lint_names(sample_loader_dataset):
    code, report = verify_load(sample_loader_dataset)
    found = failing(report)
    # only the json part is loaded: the truncated JPEG and the missing jpg are not looked at
    assert code == 1 and set(found) == {"shard-0.tar/s0_005.json", "shard-2.tar/s2_001"}
    assert "KeyError" in found["shard-2.tar/s2_001"]
    ours = {where.split("/")[1].split(".")[0] for where in found}
    assert ours == energon_lint_failures(sample_loader_dataset)


def test_crude_dataset_decodes_every_part_with_energons_default_decoder(crude_dataset):
    code, report = verify_load(crude_dataset)
    # no field map: the sample without a jpg and the JSON without a caption load fine
    assert code == 1 and set(failing(report)) == {"shard-0.tar/s0_005.json", "shard-1.tar/s1_003.jpg"}


def test_samples_excluded_in_split_yaml_are_not_loaded(crude_dataset, tmp_path):
    copy = tmp_path / "excluded"
    for path in crude_dataset.rglob("*"):
        if path.is_file():
            target = copy / path.relative_to(crude_dataset)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    split_yaml = copy / ".nv-meta" / "split.yaml"
    split_yaml.write_text(
        split_yaml.read_text().replace("exclude: []", "exclude:\n- shard-0.tar/s0_005\n- shard-1.tar/s1_003")
    )
    code, report = verify_load(copy)
    assert code == 0 and report["healthy"] and report["loaded"] == 22


def test_split_option_loads_only_that_split(crude_dataset):
    code, report = verify_load(crude_dataset, "--split", "val")
    assert code == 0 and report["loaded"] == 0


def test_report_names_shard_key_part_and_exception_for_people(crude_dataset):
    result = run_shardprep("verify", str(crude_dataset), "--load", "--num-workers", "2")
    assert result.returncode == 1
    assert "24 samples loaded through dataset.yaml" in result.stdout
    assert (
        "PROBLEM shard-1.tar/s1_003.jpg: sample 's1_003' of split 'train' does not load through dataset.yaml:"
        " part 'jpg' raises OSError" in result.stdout
    )
    assert "`shard-1.tar/s1_003` to `exclude` in split.yaml" in result.stdout
    assert result.stdout.rstrip().endswith("NOT healthy: 2 problem(s)")


def test_a_split_the_dataset_lacks_is_named_with_the_splits_it_has(crude_dataset):
    """As preview and mount name it (energon's loader stopped on `AssertionError: Invalid split part`)."""
    result = run_shardprep("verify", str(crude_dataset), "--load", "--split", "nosuch")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{crude_dataset} has no split 'nosuch'; its splits are test, train, val." in result.stderr


def test_split_without_load_is_a_usage_error(crude_dataset):
    result = run_shardprep("verify", str(crude_dataset), "--split", "train")
    assert result.returncode == 2 and "--split is for --load" in result.stderr


def test_without_energon_load_says_how_to_install_it(crude_dataset):
    # `megatron` made unimportable in the command's process, as if energon were not installed
    code = (
        "import sys; sys.modules['megatron'] = None; from prep.cli import main;"
        f" main(['verify', {str(crude_dataset)!r}, '--load'])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: `verify --load` decodes samples with megatron-energon, which is not installed here:"
        " pip install shardprep[energon]"
    ]


def test_load_check_reports_progress_and_failures_in_process(crude_dataset):
    from cookers.energon_lint import load_check

    seen = []
    report = load_check(crude_dataset, workers=1, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (24, 24) and report.samples == 24 and report.splits == ["train"]
    assert sorted((failure.shard, failure.key, failure.part) for failure in report.failures) == [
        ("shard-0.tar", "s0_005", "json"),
        ("shard-1.tar", "s1_003", "jpg"),
    ]


def test_a_field_map_without_a_field_the_sample_type_needs_is_one_error_naming_dataset_yaml(
    field_map_dataset, tmp_path
):
    dataset = Path(shutil.copytree(field_map_dataset, tmp_path / "d"))
    dataset_yaml = dataset / ".nv-meta" / "dataset.yaml"
    text = dataset_yaml.read_text()
    assert "  caption: json[caption]\n" in text
    dataset_yaml.write_text(text.replace("  caption: json[caption]\n", ""))
    result = run_shardprep("verify", str(dataset), "--load", "--num-workers", "1")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "PROBLEM" not in result.stdout  # not one per sample, each with advice about its data
    assert (
        ".nv-meta/dataset.yaml: its field_map gives CaptioningSample no 'caption', which every sample needs"
        in result.stderr
    ), result.stderr
