"""Test tokens for apps with FastMCP's auth: one RSA key pair, tokens per user.

The tests play the authorization server: :class:`TokenIssuer` makes a key
pair, writes the public half where the app reads it (``ownapp``'s
``OWNAPP_JWT_PUBLIC_KEY_FILE``, or a Secret for the chart), and signs RS256
tokens for named users with FastMCP's own :class:`RSAKeyPair`. The private key
stays in memory; tokens go only into ``Authorization`` headers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fastmcp.server.auth.providers.jwt import RSAKeyPair

ISSUER = "https://auth.ownapp.test"
AUDIENCE = "ownapp"


@dataclass
class TokenIssuer:
    """An authorization server for tests: a key pair, an issuer, an audience."""

    issuer: str = ISSUER
    audience: str = AUDIENCE
    keys: RSAKeyPair = field(default_factory=RSAKeyPair.generate)
    #: Every token signed, so a test can search logs for any of them.
    issued: list[str] = field(default_factory=list)

    @property
    def public_pem(self) -> str:
        return self.keys.public_key

    def write_public_key(self, path: Path) -> Path:
        path.write_text(self.public_pem, encoding="ascii")
        return path

    def token(self, user: str, *, expires_in: int = 3600) -> str:
        """A signed token for ``user`` (``expires_in`` < 0: one already expired)."""
        token = self.keys.create_token(
            subject=user,
            issuer=self.issuer,
            audience=self.audience,
            expires_in_seconds=expires_in,
        )
        self.issued.append(token)
        return token

    def app_env(self, public_key_file: Path, base_url: str) -> dict[str, str]:
        """The environment ``ownapp`` reads: where the key is, who issues, who it is for."""
        return {
            "OWNAPP_JWT_PUBLIC_KEY_FILE": str(public_key_file),
            "OWNAPP_JWT_ISSUER": self.issuer,
            "OWNAPP_JWT_AUDIENCE": self.audience,
            "OWNAPP_BASE_URL": base_url,
        }
