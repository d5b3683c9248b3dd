"""One contract suite for both stores: every port, against the fake and PostgreSQL."""
