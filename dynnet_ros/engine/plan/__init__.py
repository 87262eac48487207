"""engine/plan"""
