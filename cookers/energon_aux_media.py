"""energon glue for polylithic datasets written by `shardprep write --media-column`: a cooker that joins
each primary sample with its media from the auxiliary dataset.

The primary sample's `aux.json` part maps each media field to its file name in the auxiliary dataset
(a folder, or an indexed WebDataset); the metadataset YAML hands that dataset to the cooker as `media`.

    from cookers.aux_media import AuxMediaTaskEncoder
    loader = get_loader(get_train_dataset("out/metadataset.yaml", ..., task_encoder=AuxMediaTaskEncoder()))
"""

from __future__ import annotations

import json

from megatron.energon import Cooker, DefaultTaskEncoder, Sample, edataclass, stateless
from megatron.energon.cache import FileStore
from megatron.energon.task_encoder.cooking import basic_sample_keys

from prep.index.format import AUX_PART


@edataclass
class MediaSample(Sample):
    """A primary sample with its media joined in: `media[field]` is the aux file's content (raw bytes, or
    decoded by the task encoder's decoder if it has one); `parts` are the primary sample's other parts."""

    parts: dict
    media: dict


def aux_names(sample: dict) -> dict[str, str]:
    """{field: aux file name} of a crude sample (the `aux.json` part, raw or already decoded)."""
    names = sample[AUX_PART]
    return json.loads(names) if isinstance(names, bytes | str) else dict(names)


@stateless
def cook_aux_media(sample: dict, media: FileStore) -> MediaSample:
    """Fetch every media file the sample names from the auxiliary dataset, which energon passes under its
    name in the metadataset (`prep.index.format.AUX_NAME`, this parameter's name)."""
    loaded = {field: media.get(name, sample) for field, name in aux_names(sample).items()}
    parts = {name: value for name, value in sample.items() if not name.startswith("__") and name != AUX_PART}
    return MediaSample(**basic_sample_keys(sample), parts=parts, media=loaded)


class AuxMediaTaskEncoder(DefaultTaskEncoder):
    """Cooks crude primary samples into MediaSamples; `decoder=None` keeps every part and media file as bytes."""

    cookers = [Cooker(cook_aux_media)]

    def __init__(self, decoder: object = "default") -> None:
        super().__init__()
        if decoder != "default":
            self.decoder = decoder
