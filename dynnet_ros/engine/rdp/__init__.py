"""engine/rdp"""
