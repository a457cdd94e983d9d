"""Settings helpers fail loudly on bad values and read secrets from NAME_FILE."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from lab import config


def test_it_reads_typed_values(monkeypatch):
    monkeypatch.setenv("X_BOOL", "yes")
    monkeypatch.setenv("X_INT", " 7 ")
    monkeypatch.setenv("X_LIST", "a, b,,c")
    monkeypatch.setenv("X_INTS", "0,5,300")
    monkeypatch.setenv("X_JSON", '{"nodes": []}')
    assert config.env_bool("X_BOOL", False) is True
    assert config.env_int("X_INT", 1) == 7
    assert config.env_list("X_LIST", []) == ["a", "b", "c"]
    assert config.env_int_list("X_INTS", [1]) == [0, 5, 300]
    assert config.env_json("X_JSON", None) == {"nodes": []}
    assert config.env_int("X_UNSET", 3) == 3


@pytest.mark.parametrize(
    ("reader", "value"),
    [
        (lambda: config.env_bool("X", False), "maybe"),
        (lambda: config.env_int("X", 1), "ten"),
        (lambda: config.env_int("X", 1, minimum=1), "0"),
        (lambda: config.env_int_list("X", [1]), "1,two"),
        (lambda: config.env_int_list("X", [1]), "-5"),
        (lambda: config.env_json("X", None), "{not json"),
        (lambda: config.env_choice("X", "local", ("local", "kubernetes")), "docker"),
    ],
)
def test_it_fails_loudly_on_bad_values(monkeypatch, reader, value):
    monkeypatch.setenv("X", value)
    with pytest.raises(ImproperlyConfigured, match="X"):
        reader()


def test_it_reads_secrets_from_files(monkeypatch, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t\n")
    monkeypatch.delenv("STRIPE_KEY", raising=False)
    monkeypatch.setenv("STRIPE_KEY_FILE", str(secret))
    assert config.env_str("STRIPE_KEY") == "s3cr3t"
    monkeypatch.setenv("STRIPE_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="STRIPE_KEY_FILE"):
        config.env_str("STRIPE_KEY")
