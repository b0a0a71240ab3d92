"""What a record assembly is told: the mode and its sizing knobs, frozen and checked as they are made.

The three modes are Safe Synthesizer's (reference/safe-synthesizer-example-assembly.md):

- `tabular`: records shuffled, packed into examples of one BOS ... EOS block each;
- `grouped`: the records of one group (`group_by`) form one BOS ... EOS block; blocks are packed;
- `sequential`: records of one group in order (`order_by`), cut into examples of one block each, with a
  randomized token budget; a group longer than one example continues in the next.

Its pipeline picks the mode from two settings and time series wins over a group column (`select_mode`).

>>> options = AssemblyOptions(mode="grouped", group_by="customer_id", max_sequences_per_example="auto")
>>> options.max_sequences, AssemblyOptions(differential_privacy=True).max_sequences
(10, 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["tabular", "grouped", "sequential"]
MODES: tuple[str, ...] = ("tabular", "grouped", "sequential")
Packing = Literal["next_fit", "best_fit"]
PACKINGS: tuple[str, ...] = ("next_fit", "best_fit")

DEFAULT_PROMPT_TEMPLATE = "[INST] {instruction} {schema} [/INST]{prefill}"
DEFAULT_INSTRUCTION = "Generate a JSONL dataset with the following columns: "
#: What `max_sequences_per_example="auto"` becomes: 1 with differential privacy (one unit per example, for
#: per-example gradient clipping), 10 otherwise.
AUTO_MAX_SEQUENCES = 10
AUTO_MAX_SEQUENCES_WITH_DP = 1
#: Sequential mode draws each training example's budget uniformly in this share of the room.
FILL_RATIO = (0.7, 1.0)


def select_mode(*, time_series: bool = False, group_by: str | None = None) -> Mode:
    """The mode Safe Synthesizer's pipeline picks: sequential for time series (even with a group column),
    grouped when a group column is set, tabular otherwise.

    >>> select_mode(time_series=True, group_by="device_id"), select_mode(group_by="customer_id"), select_mode()
    ('sequential', 'grouped', 'tabular')
    """
    if time_series:
        return "sequential"
    return "grouped" if group_by is not None else "tabular"


@dataclass(frozen=True)
class AssemblyOptions:
    """Every setting of an assembly; see `cookers.records.assemble_records` for what each does."""

    mode: Mode = "tabular"
    max_seq_length: int = 2048
    max_sequences_per_example: int | Literal["auto"] | None = "auto"
    differential_privacy: bool = False
    group_by: str | None = None
    order_by: str | None = None
    packing: Packing = "next_fit"
    exact_budget: bool = False
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    instruction: str = DEFAULT_INSTRUCTION
    add_bos_token_to_prompt: bool = True
    add_eos_token_to_prompt: bool = True
    #: The schema's columns in order; None: the first record's keys.
    columns: tuple[str, ...] | None = None
    seed: int = 0
    #: sequential: draw each training example's budget between 70% and 100% of the room (the reference);
    #: False fills every example to 100%, as the reference does for validation examples.
    randomize_budget: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(
                f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)} (or use select_mode)"
            )
        if self.max_seq_length < 1:
            raise ValueError(f"max_seq_length must be at least 1, got {self.max_seq_length}")
        limit = self.max_sequences_per_example
        if not (limit is None or limit == "auto" or (isinstance(limit, int) and limit >= 1)):
            raise ValueError(f"max_sequences_per_example must be 'auto', None or an int >= 1, not {limit!r}")
        if self.packing not in PACKINGS:
            raise ValueError(f"unknown packing {self.packing!r}; choose one of {', '.join(PACKINGS)}")
        if self.packing == "best_fit" and self.mode == "sequential":
            raise ValueError(
                "packing='best_fit' is for the tabular and grouped modes; sequential keeps record order"
            )
        if self.mode == "grouped" and self.group_by is None:
            raise ValueError("mode='grouped' needs group_by=COLUMN, the column whose value makes a group")
        if self.mode == "tabular" and (self.group_by is not None or self.order_by is not None):
            column = self.group_by if self.group_by is not None else self.order_by
            raise ValueError(
                f"mode='tabular' takes no group_by/order_by (got {column!r}); use mode='grouped' or"
                " 'sequential', or select_mode(time_series=..., group_by=...)"
            )
        if self.group_by is not None and self.group_by == self.order_by:
            raise ValueError(f"group_by and order_by are the same column {self.group_by!r}")
        try:
            self.prompt_template.format(instruction="", schema="", prefill="")
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(
                f"prompt_template {self.prompt_template!r} may use only {{instruction}}, {{schema}} and"
                f" {{prefill}} ({error!r})"
            ) from None
        if self.seed < 0:
            raise ValueError(f"seed must not be negative, got {self.seed}")
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))

    @property
    def max_sequences(self) -> int | None:
        """The most units (records, or groups in grouped mode) of one example; None: no limit."""
        if self.max_sequences_per_example == "auto":
            return AUTO_MAX_SEQUENCES_WITH_DP if self.differential_privacy else AUTO_MAX_SEQUENCES
        return self.max_sequences_per_example  # type: ignore[return-value]
