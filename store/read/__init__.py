"""The read path of a chat turn: injection, retrieval, ranking and rendering."""
