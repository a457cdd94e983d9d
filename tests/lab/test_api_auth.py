"""The one parser of ``Authorization: Bearer <token>``, shared by API keys and job tokens."""

import pytest

from lab.api.auth import bearer_token


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (b"Bearer lab_abc", "lab_abc"),
        ("Bearer lab_abc", "lab_abc"),
        (b"bearer ljt_1:secret", "ljt_1:secret"),
        (b"BEARER   ljt_1:secret  ", "ljt_1:secret"),
    ],
)
def test_it_returns_the_token_of_a_bearer_header(header, token):
    assert bearer_token(header) == token


@pytest.mark.parametrize(
    "header",
    [b"", "", b"Bearer", b"Bearer a b", b"Basic dXNlcjpwdw==", b"lab_abc", "Bearer lab_é".encode()],
)
def test_it_refuses_anything_else(header):
    assert bearer_token(header) is None
