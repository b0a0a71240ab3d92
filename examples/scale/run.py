"""shardprep on object storage: prepare shards that live only in a bucket, describe their images, check them,
write a JSONL file straight into the bucket, and load the result with energon's loader through msc://.

Runs against the bucket you name (`--address s3://BUCKET/PREFIX`, with the AWS_* variables your store
needs), or, without it, an S3 server started on loopback for the run (moto's, `pip install
'moto[server]'`, part of the dev extra). `--ray` scans the shards as Ray tasks (`pip install
'shardprep[ray]'`; a local Ray instance is started for the run).

    python examples/scale/run.py                        # from the repository root
    python examples/scale/run.py --address s3://my-bucket/shardprep-example --ray
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
#: The MSC profile this example writes for energon's loader.
PROFILE = "example"


def shardprep(*args: str) -> None:
    """Run a shardprep command as a user types it, print what it says, stop the example if it fails."""
    print(f"\n$ shardprep {' '.join(args)}", flush=True)
    result = subprocess.run([sys.executable, "-m", "prep", *args], cwd=REPO, text=True, capture_output=True)
    print(result.stdout.rstrip())
    if result.stderr.strip():
        print(result.stderr.rstrip())
    if result.returncode != 0:
        raise SystemExit(f"shardprep {args[0]} failed with exit code {result.returncode}")


def make_shards(folder: Path, shards: int = 6, samples: int = 20) -> None:
    """Image-caption shards, as a WebDataset writer leaves them (PNG, caption, JSON per sample)."""
    from PIL import Image

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for shard in range(shards):
        with tarfile.open(folder / f"shard-{shard:03d}.tar", "w", format=tarfile.GNU_FORMAT) as tar:
            for index in range(samples):
                side = int(rng.integers(16, 64))
                image = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (side, side // 2 + 8, 3), dtype=np.uint8)).save(
                    image, "PNG"
                )
                parts = {
                    "png": image.getvalue(),
                    "txt": f"a picture {side} pixels high".encode(),
                    "json": json.dumps({"shard": shard, "index": index}).encode(),
                }
                for part, data in parts.items():
                    member = tarfile.TarInfo(f"{shard:03d}_{index:04d}.{part}")
                    member.size, member.mtime = len(data), 1_700_000_000
                    tar.addfile(member, io.BytesIO(data))


@contextmanager
def loopback_s3(log: Path) -> Iterator[str]:
    """A moto S3 server on a free port of 127.0.0.1 with a bucket `example`, the AWS_* variables set for it
    (this process and the commands it runs); yields the address of a prefix in that bucket."""
    if importlib.util.find_spec("moto") is None:
        raise SystemExit(
            "Without --address this example starts moto's S3 server, which is not installed:"
            " pip install 'moto[server]' (or give --address s3://BUCKET/PREFIX of a bucket you can write)."
        )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    with open(log, "wb") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit(f"the moto server did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.05)
        os.environ.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="example",
            AWS_SECRET_ACCESS_KEY="example",
            AWS_DEFAULT_REGION="us-east-1",
        )
        import boto3

        boto3.client("s3").create_bucket(Bucket="example")
        print(f"An S3 server (moto) on {endpoint}, bucket 'example'")
        yield "s3://example/run"
    finally:
        server.kill()
        server.wait()


def upload(folder: Path, address: str) -> None:
    """The shards of `folder` into the bucket below `address`, as a user's own tools would put them there."""
    from prep.storage.address import parse_address
    from prep.storage.store import open_store

    store = open_store(parse_address(address))
    for shard in sorted(folder.glob("*.tar")):
        store.upload_file(shard.name, shard)
    print(f"\nUploaded {len(list(folder.glob('*.tar')))} shards to {address} (no index there yet)")


def msc_config(path: Path, address: str) -> None:
    """A multi-storage-client config whose profile `example` is the bucket of `address` (energon's loader
    reads msc:// addresses through it; it finds the credentials as boto does)."""
    import yaml

    bucket = address.removeprefix("s3://").partition("/")[0]
    options = {"base_path": bucket, "region_name": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
    if os.environ.get("AWS_ENDPOINT_URL"):
        options["endpoint_url"] = os.environ["AWS_ENDPOINT_URL"]
    path.write_text(
        yaml.safe_dump({"profiles": {PROFILE: {"storage_provider": {"type": "s3", "options": options}}}})
    )
    os.environ["MSC_CONFIG"] = str(path)


def run(root: Path, address: str, ray: bool) -> None:
    make_shards(root / "shards")
    upload(root / "shards", f"{address}/captions")
    engine = ["--engine", "ray"] if ray else []
    print("\n1. Prepare the shards where they are: tar headers and image headers read by ranged GETs")
    shardprep(
        "prepare",
        f"{address}/captions",
        "--non-interactive",
        "--split-ratio",
        "8,1,1",
        "--crude",
        "--media-metadata-by-extension",
        "--no-progress",
        *engine,
    )
    print("\n2. Look inside without downloading the shards")
    shardprep("info", f"{address}/captions")
    shardprep("verify", f"{address}/captions")

    print("\n3. Write a JSONL file straight into the bucket: each shard goes up as soon as it is whole")
    rows = root / "rows.jsonl"
    with open(rows, "w") as file:
        for index in range(300):
            file.write(json.dumps({"id": f"r{index:04d}", "text": f"sentence number {index}"}) + "\n")
    shardprep(
        "write",
        str(rows),
        f"{address}/text",
        "--part",
        "text=txt",
        "--key-column",
        "id",
        "--maxcount",
        "100",
        "--sample-type",
        "TextSample",
        "--field-map",
        '{"text": "txt"}',
        "--no-progress",
    )

    print("\n4. energon's own loader, through msc://")
    msc_config(root / "msc.yaml", address)
    prefix = address.removeprefix("s3://").partition("/")[2]
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    dataset = get_val_dataset(
        f"msc://{PROFILE}/{prefix}/text",
        split_part="train",
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=None,
    )
    samples = list(get_loader(dataset))
    print(
        f"   {len(samples)} samples loaded from msc://{PROFILE}/{prefix}/text; the first: {samples[0].text!r}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", help="s3://BUCKET/PREFIX to use (default: a local S3 server)")
    parser.add_argument("--ray", action="store_true", help="scan the shards as Ray tasks")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shardprep-scale-") as scratch:
        root = Path(scratch)
        if args.address:
            run(root, args.address.rstrip("/"), args.ray)
        else:
            with loopback_s3(root / "moto.log") as address:
                run(root, address, args.ray)
    print("\nDone.")


if __name__ == "__main__":
    main()
