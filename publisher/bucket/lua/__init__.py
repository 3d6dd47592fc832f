"""The bucket's Lua scripts, as package data (`publisher.bucket.lua.scripts`)."""
