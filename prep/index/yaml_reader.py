"""The YAML files energon reads (a metadataset YAML, `dataset.yaml`, a `.yaml` split file, the legacy
`.info.yaml`), parsed here only as far as energon's own reader can parse them.

energon 7.4.1 parses them with rapidyaml and builds the Python values from its tree itself: an anchor
(`&name`) is read as the plain value it marks, but an alias (`*name`, also in a merge key `<<: *name`)
is read as the text `'*name'`, not the value it stands for. PyYAML resolves aliases, so a file with one
(what `yaml.safe_dump` writes for an object it meets twice) read fine here and failed in energon.
`load_yaml` refuses such a file, naming its first alias; an anchor alone is harmless and is read.
This module imports PyYAML: import it where a YAML file is read, so the command line starts fast.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from prep.errors import PrepError


class UnresolvedAliasError(PrepError):
    """A YAML file with an alias, which energon's reader does not resolve: the file, the alias's line,
    what energon makes of it (`problem`) and what to do (`advice`)."""

    def __init__(self, path: Path, anchor: str, line: int, anchor_line: int) -> None:
        self.problem = (
            f"line {line} holds the alias `*{anchor}` (of the anchor `&{anchor}` on line {anchor_line}):"
            f" energon's YAML reader does not resolve anchors and aliases, it reads the alias as the text"
            f" '*{anchor}', so energon fails on the file or reads another value than the one meant."
        )
        self.advice = (
            f"write the value out in full in place of each alias in {path} (yaml.safe_dump writes an"
            " anchor and an alias for an object it meets twice: give it a yaml.SafeDumper subclass whose"
            " `ignore_aliases` returns True)"
        )
        super().__init__(f"{path}: {self.problem} Fix: {self.advice}.")


class _FirstAlias(Exception):
    def __init__(self, anchor: str, line: int, anchor_line: int) -> None:
        self.anchor, self.line, self.anchor_line = anchor, line, anchor_line


class _AliasRefusingLoader(yaml.SafeLoader):
    """PyYAML's safe loader, stopping at the first alias it meets (lines counted from 1)."""

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            alias = self.peek_event()
            anchored = self.anchors.get(alias.anchor)
            if anchored is not None:  # an undefined alias is PyYAML's own error
                raise _FirstAlias(alias.anchor, alias.start_mark.line + 1, anchored.start_mark.line + 1)
        return super().compose_node(parent, index)


def load_yaml(text: str, path: Path) -> object:
    """`text`, the YAML file at `path`, parsed by PyYAML's safe loader; UnresolvedAliasError if it holds
    an alias, yaml.YAMLError if it is no valid YAML.

    >>> load_yaml("a: &x {b: 1}\\nc: 2\\n", Path("m.yaml"))
    {'a': {'b': 1}, 'c': 2}
    >>> load_yaml("a: &x {b: 1}\\nc: *x\\n", Path("m.yaml"))
    Traceback (most recent call last):
    prep.index.yaml_reader.UnresolvedAliasError: m.yaml: line 2 holds the alias `*x` (of the anchor `&x` on line 1): energon's YAML reader does not resolve anchors and aliases, it reads the alias as the text '*x', so energon fails on the file or reads another value than the one meant. Fix: write the value out in full in place of each alias in m.yaml (yaml.safe_dump writes an anchor and an alias for an object it meets twice: give it a yaml.SafeDumper subclass whose `ignore_aliases` returns True).
    """
    loader = _AliasRefusingLoader(text)
    try:
        return loader.get_single_data()
    except _FirstAlias as found:
        raise UnresolvedAliasError(path, found.anchor, found.line, found.anchor_line) from None
    finally:
        loader.dispose()
