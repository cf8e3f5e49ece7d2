"""The placement board: device columns with memory bars and module cards."""
