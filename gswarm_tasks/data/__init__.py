"""What a node does with data chunks: create, fetch, copy, read, and the compute actions over them."""
