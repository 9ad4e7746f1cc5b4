"""YAML with line numbers and a bound on alias expansion, for case files and agenttest.yaml."""

from __future__ import annotations

from typing import Any

import yaml

from agenttest_worker.errors import InputError, InputProblem

MAX_YAML_NODES = 200_000

YamlPath = tuple[str | int, ...]


class LineMap:
    """Lines of the nodes of one YAML document, by path from the root."""

    def __init__(self) -> None:
        self.lines: dict[YamlPath, int] = {}

    def line_of(self, path: YamlPath) -> int | None:
        """The line of `path`, or of its nearest ancestor that has one."""
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]


class _TooLarge(Exception):
    pass


class _Recursive(Exception):
    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


def _construct(loader: yaml.SafeLoader, node: yaml.Node, lines: LineMap) -> Any:
    """Build Python data from a composed YAML node, recording each node's line.

    Aliases are expanded here, so the number of built values is bounded: a "billion
    laughs" document stops with a message instead of eating the machine.
    """
    budget = [MAX_YAML_NODES]
    # Collections being built: an alias to one of them (`&a [*a]`) would never end.
    open_nodes: set[int] = set()

    def build(n: yaml.Node, path: YamlPath) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooLarge
        lines.lines.setdefault(path, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode | yaml.SequenceNode):
            if id(n) in open_nodes:
                raise _Recursive(n.start_mark.line + 1)
            open_nodes.add(id(n))
            try:
                return build_collection(n, path)
            finally:
                open_nodes.discard(id(n))
        return loader.construct_object(n, deep=True)

    def build_collection(n: yaml.Node, path: YamlPath) -> Any:
        if isinstance(n, yaml.MappingNode):
            loader.flatten_mapping(n)  # resolves `<<: *anchor` merge keys
            result: dict[Any, Any] = {}
            for key_node, value_node in n.value:
                key = loader.construct_object(key_node, deep=True)
                if not isinstance(key, str | int | float | bool) and key is not None:
                    key = str(key)
                lines.lines.setdefault((*path, key), key_node.start_mark.line + 1)
                result[key] = build(value_node, (*path, key))
            return result
        return [build(item, (*path, i)) for i, item in enumerate(n.value)]

    return build(node, ())


def parse_yaml(text: str, file: str) -> tuple[Any, LineMap]:
    """Parse one YAML document; problems (syntax, alias bombs) raise InputError."""
    lines = LineMap()
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = _construct(loader, node, lines) if node is not None else None
    except _TooLarge:
        raise InputError(
            InputProblem(
                f"YAML expands to more than {MAX_YAML_NODES:,} values (an alias bomb?)", file=file
            )
        ) from None
    except _Recursive as exc:
        raise InputError(
            InputProblem("recursive YAML alias: a value contains itself", file=file, line=exc.line)
        ) from None
    except RecursionError:
        # PyYAML composes and we build nested collections recursively.
        raise InputError(InputProblem("YAML nested too deeply", file=file)) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise InputError(
            InputProblem(
                f"invalid YAML: {exc.problem or exc.context}",
                file=file,
                line=mark.line + 1 if mark else None,
            )
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(InputProblem(f"invalid YAML: {exc}", file=file)) from None
    finally:
        loader.dispose()
    return data, lines
