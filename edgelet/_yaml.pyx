# cython: language_level=3
"""libyaml's event parser, called directly: the events of a YAML text as tuples, for edgelet.yamlload.

The agent reads manifests and kubeconfigs with it instead of PyYAML, whose package (its Python scanner, parser,
emitter and representer come with its C loader) costs a node about 1.4 MiB that never leaves. The twin
`edgelet._yaml_py` gives the same events through PyYAML; tests/unit/test_yamlload.py holds the two together.

An event is `(kind, line, column, anchor, tag, value, flag)`: kind is libyaml's event type, line and column the
0-based start mark, anchor the alias name of an ALIAS event, value only for a SCALAR; flag is whether a SCALAR
is plain and untagged (plain_implicit), whether a SEQUENCE-START or MAPPING-START is in flow style. `parse` returns the events up to the first error, and that error (None when the stream ended well), so
that the loader meets the error where PyYAML would, after the documents before it.
"""

from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stddef cimport size_t

from edgelet.util.errors import YAMLError


cdef extern from "yaml.h" nogil:
    ctypedef unsigned char yaml_char_t

    ctypedef enum yaml_error_type_t:
        YAML_NO_ERROR
        YAML_MEMORY_ERROR
        YAML_READER_ERROR
        YAML_SCANNER_ERROR
        YAML_PARSER_ERROR

    ctypedef enum yaml_sequence_style_t:
        YAML_FLOW_SEQUENCE_STYLE

    ctypedef enum yaml_mapping_style_t:
        YAML_FLOW_MAPPING_STYLE

    ctypedef enum yaml_event_type_t:
        YAML_NO_EVENT
        YAML_STREAM_START_EVENT
        YAML_STREAM_END_EVENT
        YAML_DOCUMENT_START_EVENT
        YAML_DOCUMENT_END_EVENT
        YAML_ALIAS_EVENT
        YAML_SCALAR_EVENT
        YAML_SEQUENCE_START_EVENT
        YAML_SEQUENCE_END_EVENT
        YAML_MAPPING_START_EVENT
        YAML_MAPPING_END_EVENT

    ctypedef struct yaml_mark_t:
        size_t index
        size_t line
        size_t column

    ctypedef struct _alias_data:
        yaml_char_t *anchor

    ctypedef struct _scalar_data:
        yaml_char_t *anchor
        yaml_char_t *tag
        yaml_char_t *value
        size_t length
        int plain_implicit

    ctypedef struct _sequence_data:
        yaml_char_t *anchor
        yaml_char_t *tag
        yaml_sequence_style_t style

    ctypedef struct _mapping_data:
        yaml_char_t *anchor
        yaml_char_t *tag
        yaml_mapping_style_t style

    ctypedef union _event_data:
        _alias_data alias
        _scalar_data scalar
        _sequence_data sequence_start
        _mapping_data mapping_start

    ctypedef struct yaml_event_t:
        yaml_event_type_t type
        _event_data data
        yaml_mark_t start_mark

    ctypedef struct yaml_parser_t:
        yaml_error_type_t error
        const char *problem
        size_t problem_offset
        int problem_value
        yaml_mark_t problem_mark
        const char *context
        yaml_mark_t context_mark

    const char *yaml_get_version_string()
    int yaml_parser_initialize(yaml_parser_t *parser)
    void yaml_parser_delete(yaml_parser_t *parser)
    void yaml_parser_set_input_string(yaml_parser_t *parser, const unsigned char *input, size_t size)
    int yaml_parser_parse(yaml_parser_t *parser, yaml_event_t *event)
    void yaml_event_delete(yaml_event_t *event)


LIBRARY = "libyaml " + yaml_get_version_string().decode("ascii")

# libyaml 0.2.6 (which PyYAML's wheels carry) refuses to nest collections deeper than this; 0.2.5 (Debian's and
# others') has no limit. Kept here whichever libyaml this links, counted over the events as that scanner counts
# levels (one more for a block collection), so that the same texts fail, at the same event.
MAX_NESTING = 1000


cdef inline object _text(const yaml_char_t *value):
    if value == NULL:
        return None
    return (<const char *>value).decode("utf-8")


cdef object _event(yaml_event_t *event):
    cdef yaml_event_type_t kind = event.type
    cdef size_t line = event.start_mark.line, column = event.start_mark.column
    if kind == YAML_SCALAR_EVENT:
        return (kind, line, column, _text(event.data.scalar.anchor), _text(event.data.scalar.tag),
                PyUnicode_DecodeUTF8(<const char *>event.data.scalar.value, event.data.scalar.length, "strict"),
                event.data.scalar.plain_implicit != 0)
    if kind == YAML_SEQUENCE_START_EVENT:
        return (kind, line, column, _text(event.data.sequence_start.anchor), _text(event.data.sequence_start.tag),
                None, event.data.sequence_start.style == YAML_FLOW_SEQUENCE_STYLE)
    if kind == YAML_MAPPING_START_EVENT:
        return (kind, line, column, _text(event.data.mapping_start.anchor), _text(event.data.mapping_start.tag),
                None, event.data.mapping_start.style == YAML_FLOW_MAPPING_STYLE)
    if kind == YAML_ALIAS_EVENT:
        return (kind, line, column, _text(event.data.alias.anchor), None, None, False)
    return (kind, line, column, None, None, None, False)


cdef object _error(yaml_parser_t *parser):
    problem = (parser.problem or b"").decode("utf-8", "replace")
    if parser.error == YAML_MEMORY_ERROR:
        return YAMLError("out of memory")
    if parser.error == YAML_READER_ERROR:
        return YAMLError(f"unacceptable character #x{parser.problem_value:04x}: {problem}, "
                         f"position {parser.problem_offset}")
    context = parser.context.decode("utf-8", "replace") if parser.context != NULL else None
    return YAMLError(problem, parser.problem_mark.line, parser.problem_mark.column, context=context,
                     context_line=parser.context_mark.line if context is not None else None,
                     context_column=parser.context_mark.column if context is not None else None)


def parse(str text):
    """(the events of `text` up to the first error, that error or None)."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return [], YAMLError(f"not UTF-8 text: {exc.reason} at character {exc.start}")
    cdef yaml_parser_t parser
    cdef yaml_event_t event
    cdef const unsigned char *input = data
    cdef yaml_event_type_t kind
    cdef int depth = 0
    events = []
    error = None
    if not yaml_parser_initialize(&parser):
        raise MemoryError
    try:
        # No encoding set: libyaml tells UTF-8 from the bytes, as PyYAML leaves it to, and so drops a leading byte
        # order mark before any position is counted.
        yaml_parser_set_input_string(&parser, input, len(data))
        while True:
            if not yaml_parser_parse(&parser, &event):
                error = _error(&parser)
                break
            kind = event.type
            try:
                item = _event(&event)
            finally:
                yaml_event_delete(&event)
            if kind == YAML_SEQUENCE_START_EVENT or kind == YAML_MAPPING_START_EVENT:
                depth += 1
                if depth + (0 if item[6] else 1) > MAX_NESTING:
                    level = "flow" if item[6] else "block"
                    error = YAMLError("exceeded maximum nesting depth", item[1], item[2],
                                      context=f"while increasing {level} level", context_line=item[1],
                                      context_column=item[2])
                    break
            elif kind == YAML_SEQUENCE_END_EVENT or kind == YAML_MAPPING_END_EVENT:
                depth -= 1
            events.append(item)
            if kind == YAML_STREAM_END_EVENT:
                break
    finally:
        yaml_parser_delete(&parser)
    return events, error
