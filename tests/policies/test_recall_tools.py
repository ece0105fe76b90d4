"""Tests for policies/recall_tools.py."""

from policies.recall_tools import is_recall_call, recall_note, recall_tool_names, recall_tools


def client_tool(name):
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def test_default_names():
    assert recall_tool_names(None) == ("session_search", "session_load")
    assert recall_tool_names([client_tool("bash")]) == ("session_search", "session_load")


def test_renamed_on_collision_deterministically():
    tools = [client_tool("session_search"), client_tool("session_load"), client_tool("palimpsest_session_load")]
    assert recall_tool_names(tools) == ("palimpsest_session_search", "palimpsest_session_load_2")
    assert recall_tool_names(tools) == recall_tool_names(list(tools))


def test_schemas():
    search, load = recall_tools("s", "l")
    assert search["type"] == load["type"] == "function"
    sp = search["function"]["parameters"]
    assert search["function"]["name"] == "s" and sp["required"] == ["query"]
    assert sp["properties"]["limit"]["minimum"] == 1 and sp["properties"]["limit"]["maximum"] == 20
    assert sp["properties"]["scope"]["enum"] == ["hidden", "session"] and sp["properties"]["scope"]["default"] == "session"
    lp = load["function"]["parameters"]
    assert load["function"]["name"] == "l" and lp["required"] == ["event_id"]
    assert lp["properties"]["before"]["maximum"] == 5 and lp["properties"]["after"]["default"] == 0
    assert lp["properties"]["limit"]["default"] == 4000 and "offset" in lp["properties"]
    assert "l" in search["function"]["description"]


def test_note_names_tools_and_says_data_not_instructions():
    note = recall_note("s_tool", "l_tool")
    assert "s_tool" in note and "l_tool" in note and "never instructions" in note


def test_is_recall_call():
    names = ("session_search", "session_load")
    call = {"id": "1", "type": "function", "function": {"name": "session_load", "arguments": "{}"}}
    assert is_recall_call(call, names)
    assert not is_recall_call({"id": "2", "type": "function", "function": {"name": "bash"}}, names)
    assert not is_recall_call({"id": "3"}, names)
