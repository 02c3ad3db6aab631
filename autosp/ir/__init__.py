"""The IR layer every pass shares: parsing, the IR contract, op tables, the sequence analysis and the mask algebra."""
