-- 0017: blobs, a tenant's content-addressed bytes (wasm modules, job inputs).
-- addr is 'sha256:<hex>' of data; a tenant sees only its own rows, so two
-- tenants with the same bytes hold a row each. The bytes are stored as they
-- came (no compression: modules and inputs are often compressed already).
CREATE TABLE blobs (
    client text COLLATE "C" NOT NULL,
    addr   text COLLATE "C" NOT NULL,
    size   bigint NOT NULL,
    data   bytea NOT NULL,
    dt     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (client, addr)
);
ALTER TABLE blobs ALTER COLUMN data SET STORAGE EXTERNAL;
