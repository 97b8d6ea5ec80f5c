"""Process settings, typed errors and metrics shared by the gateway's parts."""
