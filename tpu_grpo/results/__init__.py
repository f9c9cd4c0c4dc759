"""What a run leaves: its model fetched or published, its metrics and TensorBoard events, the runs table, and
where the paid hours went."""
