"""The tuned database: tables, connections and queries (rows only; ``nmgen.policy``
decides which trial wins)."""
