"""The layout of a polylithic write (`--media-column`): a primary dataset whose samples name their media,
an auxiliary dataset holding the media, and the MetadatasetV2 file that ties them together for energon.

    out/primary/   the samples, each with an `aux.json` part: {field: file name in the aux dataset}
    out/media/     the media: a folder of files, or an indexed WebDataset (`--aux-format tar`)
    out/metadataset.yaml

>>> print(metadataset_yaml(["train"], "folder"), end="")
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    path: primary
    aux:
      media: filesystem://media
"""

from __future__ import annotations

from prep.index.format import AUX_NAME

PRIMARY_FOLDER, AUX_FOLDER = "primary", "media"


def metadataset_yaml(splits: list[str], aux_format: str) -> str:
    """The MetadatasetV2 document: each split of the primary dataset with the auxiliary one as `media`."""
    import yaml

    aux = f"filesystem://{AUX_FOLDER}" if aux_format == "folder" else AUX_FOLDER
    document = {
        "__module__": "megatron.energon",
        "__class__": "MetadatasetV2",
        "splits": {split: {"path": PRIMARY_FOLDER, "aux": {AUX_NAME: aux}} for split in splits},
    }
    return yaml.dump(document, sort_keys=False)
