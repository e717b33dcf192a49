"""API keys in the serving database: created with a secret shown once (only its SHA-256 is stored), listed,
revoked, opted in to training curation, and looked up by secret on every request."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import asdict, fields, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from core.errors import ConfigError, NotFoundError
from serving.state.database import Database, utc_now
from serving.state.schema import ApiKey, keys_t


class KeyStore(Database):
    """The ``api_keys`` table."""

    def create_key(
        self,
        name: str,
        *,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        training_opt_in: bool = False,
    ) -> tuple[ApiKey, str]:
        """Create a key; returns it with its secret, which is shown this once and never stored."""
        name = name.strip()
        if not name:
            raise ConfigError("a key needs a non-empty name")
        for label, value in (("requests_per_minute", requests_per_minute), ("tokens_per_minute", tokens_per_minute)):
            if value is not None and value < 1:
                raise ConfigError(f"{label} must be >= 1, got {value}")
        secret = "lc-" + secrets.token_urlsafe(30)  # 30 bytes -> 40 url-safe characters
        key = ApiKey(
            id="key_" + secrets.token_hex(6),
            name=name,
            prefix=secret[:8],
            created_at=utc_now(),
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
            training_opt_in=training_opt_in,
        )
        try:
            with self._write() as conn:
                if conn.execute(sa.select(keys_t.c.id).where(_active_named(name))).first() is not None:
                    raise ConfigError(f"an active key named {name!r} already exists; revoke it or pick another name")
                conn.execute(sa.insert(keys_t).values(secret_sha256=_sha256(secret), **asdict(key)))
        except IntegrityError as exc:  # a concurrent create won the partial unique index
            raise ConfigError(f"an active key named {name!r} already exists") from exc
        return key, secret

    def list_keys(self, include_revoked: bool = False) -> list[ApiKey]:
        query = sa.select(keys_t).order_by(keys_t.c.created_at, keys_t.c.id)
        if not include_revoked:
            query = query.where(keys_t.c.revoked_at.is_(None))
        with self._read() as conn:
            return [_key(r) for r in conn.execute(query)]

    def revoke_key(self, id_or_name: str) -> ApiKey:
        """Revoke by id (idempotent: an already revoked key is returned as it is) or by active key name."""
        with self._write() as conn:
            row = conn.execute(sa.select(keys_t).where(keys_t.c.id == id_or_name)).first()
            row = row or conn.execute(sa.select(keys_t).where(_active_named(id_or_name))).first()
            if row is None:
                raise NotFoundError(f"no key {id_or_name!r} (neither an id nor the name of an active key)")
            key = _key(row)
            if key.revoked_at is None:
                key = replace(key, revoked_at=utc_now())
                conn.execute(sa.update(keys_t).where(keys_t.c.id == key.id).values(revoked_at=key.revoked_at))
            return key

    def set_training_opt_in(self, id_or_name: str, opt_in: bool) -> ApiKey:
        """Opt a key's conversations in to (or out of) training curation, by id or active key name.

        Curation reads the flag when it exports, and withdraws what it exported earlier from a key that opted out.
        """
        with self._write() as conn:
            row = conn.execute(sa.select(keys_t).where(keys_t.c.id == id_or_name)).first()
            row = row or conn.execute(sa.select(keys_t).where(_active_named(id_or_name))).first()
            if row is None:
                raise NotFoundError(f"no key {id_or_name!r} (neither an id nor the name of an active key)")
            key = replace(_key(row), training_opt_in=opt_in)
            conn.execute(sa.update(keys_t).where(keys_t.c.id == key.id).values(training_opt_in=opt_in))
            return key

    def authenticate(self, secret: str) -> ApiKey | None:
        """The active key whose secret this is, else None (looked up by hash: timing tells nothing of the secret)."""
        digest = _sha256(secret)
        with self._read() as conn:
            row = conn.execute(sa.select(keys_t).where(keys_t.c.secret_sha256 == digest)).first()
        if row is None or row.revoked_at is not None:
            return None
        return _key(row)

    # conversations


def _active_named(name: str) -> Any:
    return sa.and_(keys_t.c.name == name, keys_t.c.revoked_at.is_(None))


def _key(row: sa.Row[Any]) -> ApiKey:
    return ApiKey(**{f.name: getattr(row, f.name) for f in fields(ApiKey)})


def _sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
