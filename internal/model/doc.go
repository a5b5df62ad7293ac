// Package model holds a Llama-family decoder-only transformer's weights and
// its batched forward pass over page tables: one call runs any mix of prefill
// chunks and single decode steps, writes their new K/V into pages and reads
// past K/V only through each sequence's page table (see KVStore).
package model
