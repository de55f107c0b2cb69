-- The certificate (DER) each node serves HTTPS with, NULL for plain HTTP: the other nodes
-- accept exactly that certificate when they send it requests, whoever issued it (a
-- generated self-signed one included).
ALTER TABLE nodes ADD COLUMN cert BYTEA;
