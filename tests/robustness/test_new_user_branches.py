"""A new user who edits an early message of a long, already summarised session (a branch).

The edited branch must not see what only the old branch said: not in the summary block (a
checkpoint whose boundary lies past the edit is the other branch's), not in the proactive
recall passages, not in the recall tools' results.
"""

from __future__ import annotations

import orjson

from tests.robustness.scripted import client

FILLER = "lorem ipsum dolor sit amet " * 40


async def _converse(sdk, messages: list[dict], user_text) -> set[str | None]:
    """30 turns on `messages` (extended in place); the checkpoint headers the answers named."""
    checkpoints = set()
    for i in range(30):
        messages.append({"role": "user", "content": user_text(i)})
        raw = await sdk.chat.completions.with_raw_response.create(model="m-8k", messages=messages)
        checkpoints.add(raw.headers.get("x-palimpsest-checkpoint"))
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
    return checkpoints


async def test_an_edited_early_message_starts_a_branch_that_never_sees_the_old_one(scripted, scripted_gateway):
    gw = await scripted_gateway(policy={"cost_model": False})  # summarised at the plain ratios
    sdk = client(gw)
    opening = [{"role": "system", "content": "You are a helpful assistant."},
               {"role": "user", "content": "My locker code is OLDCODE-7781. " + FILLER},
               {"role": "assistant", "content": "Noted."}]
    old_checkpoints = await _converse(sdk, list(opening), lambda i: f"turn {i}: {FILLER}")
    assert old_checkpoints - {None}, "the old branch was summarised"
    assert any("OLDCODE-7781" in orjson.dumps(body).decode() for body in scripted.chats()[-3:]), "the old branch kept its fact"
    # The user edits the first message and carries on from there.
    edited = [opening[0], {"role": "user", "content": "My locker code is NEWCODE-1234. " + FILLER}, opening[2]]
    seen = len(scripted.chats())
    new_checkpoints = await _converse(sdk, list(edited), lambda i: f"edited turn {i}: {FILLER} what is my locker code?")
    assert new_checkpoints - {None} and not (new_checkpoints & old_checkpoints - {None}), "its own summaries only"
    for body in scripted.chats()[seen:]:
        assert "OLDCODE" not in orjson.dumps(body).decode()
    assert any("NEWCODE-1234" in orjson.dumps(body).decode() for body in scripted.chats()[-3:])
