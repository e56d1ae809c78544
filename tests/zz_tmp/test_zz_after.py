def test_after():
    import ray
    print("AFTER ray initialized:", ray.is_initialized())
