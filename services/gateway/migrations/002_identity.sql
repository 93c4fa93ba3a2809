-- Identity: API tokens, sign-in sessions, role bindings and pending OpenID Connect sign-ins, shared by every
-- gateway replica (docs/security/identity.md). Only hashes of secrets are stored. Tokens and sessions are
-- never deleted (revoked_at / ended_at keep the record); the gateway's login may not DELETE them
-- (libs/runtime/dbroles.py grants it SELECT, INSERT, UPDATE only).
CREATE TABLE gateway.tokens (
    id            text PRIMARY KEY,
    sha256        text NOT NULL UNIQUE,
    actor         text NOT NULL,
    role          text NOT NULL,
    org           text,                      -- NULL: fleet-wide
    project       text,                      -- NULL: every project of the organisation
    description   text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL,
    created_by    text,
    expires_at    timestamptz,               -- NULL: no expiry
    last_used_at  timestamptz,
    revoked_at    timestamptz,
    revoked_by    text,
    source        text NOT NULL DEFAULT 'api'  -- 'api', or 'file' (imported from a tokens file)
);
CREATE INDEX tokens_actor ON gateway.tokens (actor);

CREATE TABLE gateway.sessions (
    id            text PRIMARY KEY,
    sha256        text NOT NULL UNIQUE,
    kind          text NOT NULL,             -- 'panel' (browser) or 'cli' (teto login)
    actor         text NOT NULL,
    provider      text NOT NULL,
    subject       text NOT NULL,             -- the provider's sub
    roles         text[] NOT NULL,
    org           text,
    grants        jsonb NOT NULL,            -- each role and organisation with the claim or binding it came from
    id_token      text,                      -- kept for RP-initiated logout (id_token_hint)
    created_at    timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    last_used_at  timestamptz,
    ended_at      timestamptz,
    ended_reason  text
);
CREATE INDEX sessions_actor ON gateway.sessions (actor);

CREATE TABLE gateway.role_bindings (
    id            text PRIMARY KEY,
    provider      text NOT NULL,             -- '*' for every provider
    subject       text NOT NULL,             -- the provider's sub or the actor name
    role          text NOT NULL,
    org           text,
    created_at    timestamptz NOT NULL,
    created_by    text NOT NULL,
    UNIQUE (provider, subject, role, org)
);

CREATE TABLE gateway.oidc_logins (
    state         text PRIMARY KEY,
    provider      text NOT NULL,
    nonce         text NOT NULL,
    verifier      text NOT NULL,             -- the PKCE code verifier
    next_path     text NOT NULL,
    created_at    timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL
);
