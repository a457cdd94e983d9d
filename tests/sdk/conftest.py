"""SDK tests run without Django or a database: labsdk must work on its own."""
