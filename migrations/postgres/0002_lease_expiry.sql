-- Lapsed leases are looked up by expiry: threads a dead node left shown live (adopted at
-- each renewal tick) and leases lapsed long ago (swept).
CREATE INDEX leases_by_expiry ON leases (expires_at);
