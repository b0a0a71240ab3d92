"""shardprep write end to end: raw data to prepared shards in one pass, then energon loads them.

    python examples/write/run.py [--out DIR]

1. A JSONL text corpus -> shards split 8/1/1 by document group, loaded with energon's TextSample.
2. An image-caption folder (0001.jpg + 0001.txt) -> monolithic shards, loaded as crude samples.
3. The same folder, polylithic: captions in the shards, images in an auxiliary dataset, joined at load time
   by the cooker in cookers/energon_aux_media.py through a MetadatasetV2 YAML.
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
warnings.filterwarnings("ignore", message=".*pin_memory.*")


def cook_monolithic(sample: dict):  # noqa: ANN201
    """The monolithic sample as the same MediaSample the polylithic cooker returns."""
    from megatron.energon.task_encoder.cooking import basic_sample_keys

    from cookers.energon_aux_media import MediaSample

    return MediaSample(
        **basic_sample_keys(sample), parts={"txt": sample["txt"]}, media={"jpg": sample["jpg"]}
    )


def MonolithicTaskEncoder():  # noqa: ANN201, N802
    from megatron.energon import Cooker, DefaultTaskEncoder, stateless

    class Encoder(DefaultTaskEncoder):
        cookers = [Cooker(stateless(cook_monolithic))]

    return Encoder()


def shardprep(*args: str) -> None:
    command = [sys.executable, "-m", "prep", "write", *args, "--no-progress"]
    print("   $ shardprep write " + shlex.join(args))
    output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=REPO).stdout
    print("     " + output.strip().replace("\n", "\n     "))


def make_inputs(root: Path) -> tuple[Path, Path]:
    from PIL import Image

    corpus = root / "corpus.jsonl"
    with open(corpus, "w") as file:
        for i in range(300):
            file.write(
                json.dumps({"doc": f"d{i // 3}", "text": f"Sentence {i % 3} of document {i // 3}."}) + "\n"
            )
    images = root / "images"
    images.mkdir()
    for i in range(24):
        out = io.BytesIO()
        Image.new("RGB", (32, 32), (i * 10, 255 - i * 10, 128)).save(out, format="JPEG")
        (images / f"{i:04d}.jpg").write_bytes(out.getvalue())
        (images / f"{i:04d}.txt").write_text(f"a square of colour {i}")
    return corpus, images


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="working folder to keep (default: a temporary one, removed)")
    args = parser.parse_args()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        run(args.out)
        print(f"   outputs in {args.out}")
        return
    with tempfile.TemporaryDirectory(prefix="shardprep-write-") as scratch:
        run(Path(scratch))


def run(root: Path) -> None:
    corpus, images = make_inputs(root)

    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    from cookers.energon_aux_media import AuxMediaTaskEncoder

    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)

    def load(path: Path, split: str = "train", **kwargs: object) -> list:
        return list(
            get_loader(
                get_val_dataset(
                    path, split_part=split, worker_config=worker_config, batch_size=None, **kwargs
                )
            )
        )

    print("1. JSONL text corpus, split 8/1/1 with every document's sentences in one split and one shard")
    shardprep(
        str(corpus),
        str(root / "text"),
        "--part",
        "text=txt",
        "--split-ratio",
        "8,1,1",
        "--group-by",
        "doc",
        "--group-contiguous",
        "--maxcount",
        "50",
        "--sample-type",
        "TextSample",
        "--field-map",
        '{"text": "txt"}',
    )
    for sample in load(root / "text", "val")[:3]:
        print(f"   val sample {sample.__key__}: {sample.text!r}")

    print("2. Image-caption folder, monolithic (jpg and txt parts in the shards)")
    shardprep(str(images), str(root / "mono"), "--maxcount", "10")
    first = load(root / "mono", task_encoder=MonolithicTaskEncoder())[0]
    print(
        f"   {first.__key__}: caption {first.parts['txt']!r}, image tensor {tuple(first.media['jpg'].shape)}"
    )

    print("3. The same folder, polylithic (images in an auxiliary folder, names in the shards)")
    shardprep(str(images), str(root / "poly"), "--media-column", "jpg", "--maxcount", "10")
    print("   " + (root / "poly" / "metadataset.yaml").read_text().replace("\n", "\n   "))
    joined = load(root / "poly" / "metadataset.yaml", task_encoder=AuxMediaTaskEncoder())
    for sample in joined[:3]:
        print(
            f"   {sample.__key__}: caption {sample.parts['txt']!r}, image tensor {tuple(sample.media['jpg'].shape)}"
        )
    print(f"   {len(joined)} joined samples loaded")


if __name__ == "__main__":
    main()
