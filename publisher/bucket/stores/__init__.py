"""Small stores of bucket-wide keys: fleet, Spark ledgers, cursor sets, durable consumers."""
