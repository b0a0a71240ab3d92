"""The errors of record assembly: each names the record or group, its token count, the budget, and what to
change (the sizing advice of the reference guide), and is raised before any example is produced.

All are `ValueError`s. Safe Synthesizer says only "the generator ran into errors" for a group that is too
long or a missing group column; these say which.

>>> print(RecordTooLongError.build("record #3", 120, limit=100, max_seq_length=128, prompt_tokens=24, framing=4))
record #3 takes 120 tokens, more than the 100 a record may take: max_seq_length 128 less the schema prompt \
(24 tokens) and 4 BOS/EOS tokens. Raise max_seq_length, shorten the column names or drop columns (a shorter \
prompt), or filter out records with long text values.
"""

from __future__ import annotations

#: What shrinks the schema prompt, said once for every error it helps with.
_SHORTER_PROMPT = "shorten the column names or drop columns (a shorter prompt)"


class RecordAssemblyError(ValueError):
    """Records that cannot become examples as configured."""


class PromptTooLongError(RecordAssemblyError):
    """The schema prompt leaves no room for a record."""

    @classmethod
    def build(cls, prompt_tokens: int, framing: int, max_seq_length: int) -> PromptTooLongError:
        return cls(
            f"the schema prompt takes {prompt_tokens} tokens, and with {framing} BOS/EOS tokens it leaves no room"
            f" for a record at max_seq_length {max_seq_length}: the table is too wide for this context. Drop"
            " columns, shorten the column names or the instruction, or raise max_seq_length."
        )


class RecordTooLongError(RecordAssemblyError):
    """A record takes more tokens than an example has room for."""

    @classmethod
    def build(
        cls, name: str, tokens: int, *, limit: int, max_seq_length: int, prompt_tokens: int, framing: int
    ) -> RecordTooLongError:
        return cls(
            f"{name} takes {tokens} tokens, more than the {limit} a record may take: max_seq_length"
            f" {max_seq_length} less the schema prompt ({prompt_tokens} tokens) and {framing} BOS/EOS tokens."
            f" Raise max_seq_length, {_SHORTER_PROMPT}, or filter out records with long text values."
        )


class GroupTooLongError(RecordAssemblyError):
    """A group (grouped mode) takes more tokens than an example has room for."""

    @classmethod
    def build(
        cls, group: object, records: int, tokens: int, *, limit: int, max_seq_length: int, prompt_tokens: int
    ) -> GroupTooLongError:
        return cls(
            f"group {group!r} ({records} records) takes {tokens} tokens with its BOS and EOS, more than the"
            f" {limit} an example has after the schema prompt ({prompt_tokens} tokens with its BOS/EOS) at"
            f" max_seq_length {max_seq_length}. Group by a column with smaller groups (an entity id rather"
            f" than a category), raise max_seq_length, {_SHORTER_PROMPT}, or use mode='sequential', which"
            " continues a long group in the next example."
        )


class MissingColumnError(RecordAssemblyError):
    """The group or order column is not among the records' columns, or a record has no value in it."""


class RecordSchemaError(RecordAssemblyError):
    """A record does not fit the schema: a column the schema has not, or a value JSON cannot hold."""


class SplitTooLargeError(RecordAssemblyError):
    """The validation split leaves fewer training records than the reference allows."""
