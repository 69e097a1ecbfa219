"""``doctor``'s report and its verdict. Nothing here patches anything."""
