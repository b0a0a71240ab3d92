"""The token layout of a record-assembly example, and the budget arithmetic, stated once.

An example is `[BOS] prompt [EOS]` (each of the two by its flag), then one `BOS records EOS` block per
block of records: one block in the tabular and sequential modes, one per group in grouped mode. The prompt is
the template with the schema `"col":<unk>` joined by `,` and an empty `{prefill}`. A record is its compact
JSON (`json.dumps(record, separators=(",", ":"))`, columns in schema order) and a newline, tokenized on its
own; a block's tokens are its records' tokens one after the other. Labels equal the input ids (unshifted,
Hugging Face convention) except the prompt part, which is -100; the blocks' BOS and EOS are labels. There is
no padding inside an example, so its attention mask is all ones.

The budget arithmetic is the reference's own by default, slips included, so that a model sees exactly what
Safe Synthesizer would show it (P: prompt tokens, P': with its BOS/EOS, L: `max_seq_length`):

- a record may take `L - P - 4` tokens (the reference takes 2 x 2 special tokens off, whatever the flags);
  the tabular and sequential modes fill an example's single block up to that (`record_budget`);
- grouped mode adds the next group while `tokens so far + next group <= L - P - 2`: the prompt is counted
  twice and the next group's BOS/EOS not at all. Over units of `group + 2` tokens that is a room of
  `L - P - P'` (`group_room`); the first group of an example goes in whenever `P' + group + 2 <= L`.

With `exact_budget=True` every check is the true token count: `L - P' - 2` for records, `L - P'` for groups.

>>> from cookers.records_options import AssemblyOptions
>>> RecordLayout.schema_text(("customer_id", "amount"))
'"customer_id":<unk>,"amount":<unk>'
>>> RecordLayout.record_text({"customer_id": "C-001", "amount": 42.5}, ("customer_id", "amount"))
'{"customer_id":"C-001","amount":42.5}\\n'
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from cookers.records_errors import PromptTooLongError, RecordSchemaError, RecordTooLongError
from cookers.records_options import AssemblyOptions
from cookers.tokenizer import TOKEN_DTYPE, TokenizerAdapter

IGNORE_INDEX = -100
#: The reference's count of special tokens around a sequence; it takes off twice this for the prompt's and
#: the records' BOS/EOS, whatever the prompt flags say.
REFERENCE_SPECIAL_TOKENS = 2
#: Examples are laid out this many tokens at a time, so temporary index arrays stay small.
_LAYOUT_CHUNK_TOKENS = 1 << 20
#: Records are serialised and tokenized this many at a time.
_TOKENIZE_BATCH = 8192

_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))


def _refuse(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _compact_encoder() -> Callable[[object], str]:
    """`json.dumps(value, separators=(",", ":"))`, the same text, with the C encoder made once rather than
    once per call (what `JSONEncoder.encode` does); the pure-Python encoder where there is no C one."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _COMPACT_JSON.encode
    encoder = make(None, _refuse, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
    return lambda value: "".join(encoder(value, 0))


_compact_json = _compact_encoder()


@dataclass(frozen=True, slots=True, eq=False)
class RecordExample:
    """One training example: `input_ids` (int32, no padding), how many of its first tokens are the prompt,
    how many records it holds, and the group values of its blocks (empty in tabular mode)."""

    input_ids: np.ndarray
    num_prompt_tokens: int
    num_records: int
    groups: tuple = ()

    @property
    def labels(self) -> np.ndarray:
        """The input ids, -100 on the prompt (records' BOS and EOS included as labels)."""
        labels = self.input_ids.copy()
        labels[: self.num_prompt_tokens] = IGNORE_INDEX
        return labels

    @property
    def attention_mask(self) -> np.ndarray:
        """All ones: an example has no padding."""
        return np.ones(len(self.input_ids), dtype=np.int8)

    def __len__(self) -> int:
        return len(self.input_ids)

    def to_dict(self) -> dict[str, list[int]]:
        """`input_ids`, `attention_mask` and `labels` as lists, as the reference's examples are."""
        return {
            "input_ids": self.input_ids.tolist(),
            "attention_mask": self.attention_mask.tolist(),
            "labels": self.labels.tolist(),
        }


@dataclass(frozen=True)
class TokenizedRecords:
    """Records as tokens: record `i` is `tokens[offsets[i]:offsets[i + 1]]`."""

    tokens: np.ndarray
    offsets: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1


@dataclass(frozen=True)
class RecordLayout:
    """The layout of the examples of one schema: its columns in serialisation order, its prompt, the budget
    arithmetic and the tokenizer (used without its own BOS/EOS settings)."""

    options: AssemblyOptions
    #: Serialisation order: the schema's, with the group and order columns first in sequential mode.
    columns: tuple[str, ...]
    prompt_ids: np.ndarray
    prompt_block: np.ndarray
    bos_id: int
    eos_id: int
    tokenizer: TokenizerAdapter

    @classmethod
    def build(
        cls, options: AssemblyOptions, tokenizer: TokenizerAdapter, columns: Sequence[str]
    ) -> RecordLayout:
        """The layout of records with these schema columns; PromptTooLongError if no record would fit."""
        if tokenizer.bos_id is None or tokenizer.eos_id is None:
            raise ValueError(
                "record blocks are framed by BOS ... EOS: the tokenizer needs bos_id and eos_id"
                " (load_tokenizer(..., bos_token=..., eos_token=...))"
            )
        columns = tuple(columns)
        if options.mode == "sequential":
            first = tuple(c for c in (options.group_by, options.order_by) if c is not None and c in columns)
            columns = first + tuple(c for c in columns if c not in first)
        plain = replace(tokenizer, add_bos=False, add_eos=False)
        prompt = options.prompt_template.format(
            instruction=options.instruction, schema=cls.schema_text(columns), prefill=""
        )
        prompt_ids = plain.encode(prompt)
        head = [tokenizer.bos_id] if options.add_bos_token_to_prompt else []
        tail = [tokenizer.eos_id] if options.add_eos_token_to_prompt else []
        block = np.concatenate([np.asarray(head, TOKEN_DTYPE), prompt_ids, np.asarray(tail, TOKEN_DTYPE)])
        layout = cls(options, columns, prompt_ids, block, tokenizer.bos_id, tokenizer.eos_id, plain)
        if layout.record_budget < 1:
            raise PromptTooLongError.build(len(prompt_ids), layout._framing, options.max_seq_length)
        return layout

    # -- the format ---------------------------------------------------------------------------------------
    @staticmethod
    def schema_text(columns: Sequence[str]) -> str:
        """The `{schema}` of the prompt: `"column":<unk>` for each column, joined by commas."""
        return ",".join(f'"{column}":<unk>' for column in columns)

    @staticmethod
    def record_text(record: Mapping, columns: tuple[str, ...]) -> str:
        """A record's text: compact JSON, columns in `columns` order (a missing one as null), and a newline;
        RecordSchemaError for a column outside the schema or a value JSON cannot hold."""
        if tuple(record) != columns:
            extra = [key for key in record if key not in columns]
            if extra:
                raise RecordSchemaError(
                    f"has column {extra[0]!r}, which is not in the schema ({', '.join(columns)}); pass"
                    " columns=... naming every column, or give all records the same columns"
                )
            record = {column: record.get(column) for column in columns}
        try:
            return _compact_json(record) + "\n"
        except (TypeError, ValueError, RecursionError) as error:
            raise RecordSchemaError(f"has a value JSON cannot hold ({error})") from None

    # -- the arithmetic -----------------------------------------------------------------------------------
    @property
    def prompt_tokens(self) -> int:
        """P: the schema prompt's tokens, without its BOS/EOS."""
        return len(self.prompt_ids)

    @property
    def framed_prompt_tokens(self) -> int:
        """P': the prompt with its BOS/EOS, as it stands in every example."""
        return len(self.prompt_block)

    @property
    def _framing(self) -> int:
        """The BOS/EOS tokens the record budget takes off besides the prompt's own tokens."""
        if self.options.exact_budget:
            return self.framed_prompt_tokens - self.prompt_tokens + 2
        return 2 * REFERENCE_SPECIAL_TOKENS

    @property
    def record_budget(self) -> int:
        """Tokens one block of records may take (tabular, sequential), and the most one record may take."""
        return self.options.max_seq_length - self.prompt_tokens - self._framing

    @property
    def group_room(self) -> int:
        """Grouped mode's fit check as a room for units of `group + 2` tokens (see the module's text)."""
        if self.options.exact_budget:
            return self.group_limit
        return self.options.max_seq_length - self.prompt_tokens - self.framed_prompt_tokens

    @property
    def group_limit(self) -> int:
        """The most `group + 2` may be: a group alone in an example must fit in max_seq_length."""
        return self.options.max_seq_length - self.framed_prompt_tokens

    # -- records to tokens ----------------------------------------------------------------------------------
    def texts(self, records: Sequence[Mapping], name: Callable[[int], str]) -> list[str]:
        """Every record's text; RecordSchemaError naming the first record that does not fit the schema."""
        columns, text = self.columns, self.record_text
        encode = _compact_json
        out = []
        for index, record in enumerate(records):
            if tuple(record) == columns:  # the usual case, without the checks
                try:
                    out.append(encode(record) + "\n")
                    continue
                except (TypeError, ValueError, RecursionError):
                    pass
            try:
                out.append(text(record, columns))
            except RecordSchemaError as error:
                raise RecordSchemaError(f"{name(index)} {error}") from None
        return out

    def tokenize(self, records: Sequence[Mapping], name: Callable[[int], str]) -> TokenizedRecords:
        """Serialise and tokenize records, a batch at a time (so the tokenizer's per-text objects never pile
        up); RecordTooLongError naming the first record that exceeds the budget."""
        pieces, all_lengths = [], []
        for start in range(0, len(records), _TOKENIZE_BATCH):
            arrays = self.tokenizer.encode_batch(
                self.texts(records[start : start + _TOKENIZE_BATCH], lambda i, s=start: name(s + i))
            )
            lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
            too_long = np.flatnonzero(lengths > self.record_budget)
            if len(too_long):
                first = int(too_long[0])
                raise RecordTooLongError.build(
                    name(start + first),
                    int(lengths[first]),
                    limit=self.record_budget,
                    max_seq_length=self.options.max_seq_length,
                    prompt_tokens=self.prompt_tokens,
                    framing=self._framing,
                )
            pieces.append(np.concatenate(arrays).astype(TOKEN_DTYPE, copy=False))
            all_lengths.append(lengths)
        tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=TOKEN_DTYPE)
        lengths = np.concatenate(all_lengths) if all_lengths else np.zeros(0, dtype=np.int64)
        return TokenizedRecords(tokens, np.concatenate(([0], np.cumsum(lengths))))

    # -- tokens to examples -----------------------------------------------------------------------------------
    def examples(
        self,
        records: TokenizedRecords,
        order: np.ndarray,
        block_offsets: np.ndarray,
        example_offsets: np.ndarray,
        block_groups: Sequence[object] | None = None,
    ) -> list[RecordExample]:
        """Lay examples out: `order` lists record indices in output order, `block_offsets` cut it into
        blocks (each framed by BOS ... EOS) and `example_offsets` cut the blocks into examples. Vectorized, a
        few thousand examples at a time; each example's ids are a view into its chunk's array.

        >>> prompt, framed = np.array([7, 8], TOKEN_DTYPE), np.array([1, 7, 8, 2], TOKEN_DTYPE)
        >>> layout = RecordLayout(AssemblyOptions(), (), prompt, framed, bos_id=1, eos_id=2, tokenizer=None)
        >>> records = TokenizedRecords(np.arange(10, 16, dtype=np.int32), np.array([0, 2, 3, 6]))
        >>> [e.input_ids.tolist() for e in layout.examples(records, np.array([2, 0, 1]), np.array([0, 2, 3]),
        ...                                                 np.array([0, 1, 2]))]
        [[1, 7, 8, 2, 1, 13, 14, 15, 10, 11, 2], [1, 7, 8, 2, 1, 12, 2]]
        """
        out: list[RecordExample] = []
        lengths = records.lengths[order]
        record_ends = np.cumsum(lengths)
        block_ends = np.concatenate(([0], record_ends))[block_offsets]
        example_ends = block_ends[example_offsets]
        first = 0
        num_examples = len(example_offsets) - 1
        while first < num_examples:
            limit = example_ends[first] + _LAYOUT_CHUNK_TOKENS
            last = min(
                max(int(np.searchsorted(example_ends, limit, side="right")) - 1, first + 1), num_examples
            )
            out.extend(self._chunk(records, order, block_offsets, example_offsets, first, last, block_groups))
            first = last
        return out

    def _chunk(
        self,
        records: TokenizedRecords,
        order: np.ndarray,
        block_offsets: np.ndarray,
        example_offsets: np.ndarray,
        first: int,
        last: int,
        block_groups: Sequence[object] | None,
    ) -> list[RecordExample]:
        """Examples `first` to `last` (exclusive) in one array."""
        b0, b1 = int(example_offsets[first]), int(example_offsets[last])
        r0, r1 = int(block_offsets[b0]), int(block_offsets[b1])
        chosen = order[r0:r1]
        lengths = records.lengths[chosen]
        starts = records.offsets[:-1][chosen]
        record_starts = np.cumsum(lengths) - lengths
        total = int(lengths.sum())
        positions = np.arange(total, dtype=np.int64)
        stream = records.tokens[positions + np.repeat(starts - record_starts, lengths)]

        # Blocks and examples of this chunk, counted from 0.
        blocks = block_offsets[b0 : b1 + 1] - r0
        block_token_starts = np.concatenate(([0], np.cumsum(lengths)))[blocks]
        block_lengths = np.diff(block_token_starts)
        examples = example_offsets[first : last + 1] - b0
        num_blocks, num_examples = len(block_lengths), last - first
        example_of_block = np.repeat(np.arange(num_examples, dtype=np.int64), np.diff(examples))
        prompt = self.prompt_block
        framed = len(prompt)
        # A block's first record token lands after the prompts and BOS/EOS pairs before it, and its own BOS.
        block_shift = 2 * np.arange(num_blocks, dtype=np.int64) + 1 + (example_of_block + 1) * framed
        ids = np.empty(total + 2 * num_blocks + num_examples * framed, dtype=TOKEN_DTYPE)
        ids[positions + np.repeat(block_shift, block_lengths)] = stream
        ids[block_token_starts[:-1] + block_shift - 1] = self.bos_id
        ids[block_token_starts[1:] + block_shift] = self.eos_id
        first_blocks = examples[:-1]
        example_starts = block_token_starts[first_blocks] + block_shift[first_blocks] - 1 - framed
        if framed:
            ids[example_starts[:, None] + np.arange(framed)] = prompt
        bounds = np.append(example_starts, len(ids)).tolist()
        records_per_example = np.diff(blocks[examples]).tolist()
        out = []
        for e in range(num_examples):
            lo, hi = int(examples[e]) + b0, int(examples[e + 1]) + b0
            groups = tuple(block_groups[lo:hi]) if block_groups is not None else ()
            out.append(RecordExample(ids[bounds[e] : bounds[e + 1]], framed, records_per_example[e], groups))
        return out
