"""Node-to-node transfer: signed one-prefix tokens (`tokens`), the read-only file server (`server`), and the pulling
client (`client`) that verifies every block as it lands (`ledger`, `verify`)."""
