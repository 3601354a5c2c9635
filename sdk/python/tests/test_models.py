"""The SDK's values are read from the answers the OpenAPI document types: every field a
model class reads is a key of the generated TypedDict of that answer (sandgate.schema), so a
view the gateway changes (and the models regenerated from its document) fails here as well
as under mypy --strict."""

from __future__ import annotations

import dataclasses

import pytest

from sandgate import models, schema

# Model fields that are not keys of the answer: what the SDK derives or keeps itself.
DERIVED = {"raw", "egress_token", "token"}


def keys(name: str) -> set:
    typed = getattr(schema, name)
    return set(typed.__required_keys__) | set(typed.__optional_keys__)


MODELS = [
    models.AttemptRecord,
    models.SandboxInfo,
    models.Credential,
    models.Delegation,
    models.Plan,
    models.FileEntry,
]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_model_field_is_a_key_of_its_schema(model):
    fields = {f.name for f in dataclasses.fields(model)} - DERIVED
    missing = fields - keys(model.SCHEMA)
    assert not missing, f"{model.__name__} reads {sorted(missing)}, which {model.SCHEMA} does not have"


def test_the_egress_token_is_a_field_of_the_sandbox_view():
    assert "egress" in keys("SandboxView")
    assert {"token", "token_already_shown", "proxy_url"} <= keys("EgressView")


def test_the_delegation_mint_answer_carries_the_token():
    assert keys("MintedDelegation") == {"delegation", "token"}


def test_explain_and_list_pages_are_typed():
    assert {"pools", "order", "error", "priorities"} <= keys("Explanation")
    assert {"pool", "eligible", "unmet_requirements", "rank", "position"} <= keys("PoolExplanation")
    assert keys("SandboxPage") == {"sandboxes", "next_cursor"}
    assert keys("DelegationList") == {"delegations"}
    assert keys("CredentialList") == {"credentials"}


def test_files_list_and_snapshot_answers_are_typed():
    assert keys("FileList") == {"path", "entries"}
    assert {"name", "kind", "size", "mode", "modified_unix"} == keys("SandboxEntry")
    assert keys("SnapshotTaken") == {"snapshot", "export"}
    assert {"id", "kind", "pool", "provider", "size_bytes", "sandbox_id", "created_ms"} <= keys("SnapshotView")
    assert keys("ExportSummary") == {"files", "dirs", "bytes", "skipped"}
