"""Query expansion with the summary's entities: which entities a query is linked to."""

from __future__ import annotations

from store.query_expansion import expand_query, summary_entities

SUMMARY = ("## Decisions\n- Opened ticket OPS-7731 to track the staging database password rotation.\n"
           "- Booked Ryokan Sakura in Kyoto, confirmation KX-48213.\n- The runtime is pinned to v3.11.7.\n"
           "- Files: /srv/app/migrations/0042_add_ledger.py")
STATE = {"ids": ["OPS-7731", "KX-48213", "UNUSED-1"], "names": ["Ryokan Sakura"], "versions": ["v3.11.7"],
         "paths": ["/srv/app/migrations/0042_add_ledger.py"]}


def test_entities_are_the_summarys_names_ids_and_versions_in_its_order():
    entities = summary_entities(SUMMARY, STATE)
    assert entities[:3] == ("OPS-7731", "Ryokan Sakura", "KX-48213")
    assert "v3.11.7" in entities and "UNUSED-1" not in entities  # not named by the summary
    assert not any("/" in e for e in entities)  # paths split into words every path shares
    assert summary_entities(None, STATE) == ()


def test_a_paraphrase_gets_the_entities_of_the_lines_it_shares_words_with():
    entities = summary_entities(SUMMARY, STATE)
    assert expand_query("Which issue did I open for changing the staging DB credentials?", SUMMARY, entities) == "OPS-7731"
    assert expand_query("Where are we staying in Kyoto?", SUMMARY, entities) == "Ryokan Sakura KX-48213"
    assert expand_query("What is the weather like?", SUMMARY, entities) == ""
    assert expand_query("Is OPS-7731 about the staging rotation?", SUMMARY, entities) == ""  # already asked
    assert expand_query("staging", None, entities) == "" and expand_query("staging", SUMMARY, ()) == ""


def test_a_line_that_only_lists_values_links_no_query():
    # Its paths hold "release" and "migration", but the line says nothing about either.
    listing = "## Values\n- DEP-58213, ZFA04Y, OPS-7731, /srv/app/release/migration.py, /srv/app/config/release.py"
    entities = summary_entities(listing, {"ids": ["DEP-58213", "ZFA04Y", "OPS-7731"]})
    assert entities == ("DEP-58213", "ZFA04Y", "OPS-7731")
    assert expand_query("Which release of the migration are we on?", listing, entities) == ""
    said = listing + "\n- The migration release is tracked in OPS-7731."
    assert expand_query("Which release of the migration are we on?", said, entities) == "OPS-7731"
