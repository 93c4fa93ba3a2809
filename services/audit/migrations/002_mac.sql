-- Each row's mac: HMAC-SHA256(audit key, its hash), made by the audit service, which alone holds the key
-- (services/audit/domain/anchoring.py). NULL on rows written before a key was configured ("pre-key" rows:
-- the anchors protect those). The append-only triggers cover this column like every other.
ALTER TABLE log ADD COLUMN mac text CHECK (mac ~ '^[0-9a-f]{64}$');
