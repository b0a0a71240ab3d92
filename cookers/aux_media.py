"""The old name of `cookers.energon_aux_media` (energon glue lives in `energon_*` modules); kept so existing
imports go on working."""

from cookers.energon_aux_media import AuxMediaTaskEncoder, MediaSample, aux_names, cook_aux_media

__all__ = ["AuxMediaTaskEncoder", "MediaSample", "aux_names", "cook_aux_media"]
