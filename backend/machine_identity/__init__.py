"""Machine identity: join tokens an admin makes, and the credential each machine gets for one."""
