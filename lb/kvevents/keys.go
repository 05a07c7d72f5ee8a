package kvevents

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockSize is Sluice's own key block: 16 tokens, vLLM's default
// block size, so with vLLM defaults one engine block is one key. Any engine
// block size works: keys are recomputed from the token ids (see chain).
const DefaultBlockSize = 16

// keyer computes Sluice's block keys: key(i) = xxhash64(key(i-1) || tokens of
// block i), little-endian, from a root derived from the seed. Parent-chained
// like the engines' own hashes, so a key names a whole prefix, but with
// Sluice's seed and block size: the engine's hash seed and block size need
// not match (llm-d does the same).
type keyer struct {
	blockSize int
	root      uint64
}

func newKeyer(blockSize int, seed uint64) keyer {
	var b [8 + len("sluice-kv-v1")]byte
	binary.LittleEndian.PutUint64(b[:8], seed)
	copy(b[8:], "sluice-kv-v1")
	return keyer{blockSize: blockSize, root: xxhash.Sum64(b[:])}
}

// namespace is what, besides the tokens, the engine hashed into a chain
// of blocks that Sluice can reproduce: the LoRA adapter ("n" and its name,
// or "i" and its id when the engine gives no name) and the request's
// cache_salt, by its SaltTag. Blocks of different namespaces never share
// keys: the engine cannot reuse one's for the other.
type namespace struct {
	adapter string
	salt    string // SaltTag of the cache_salt
}

// SaltTagLen is a SaltTag's length: 16 bytes of SHA-256, in hex.
const SaltTagLen = 32

// SaltTag is what a cache_salt is keyed by, and what a shared routing
// decision carries of it (Prefixes.SpeculatePeer): a fixed-size
// digest, so the salt, a tenant's secret the engine isolates its cache
// with, does not travel to the other instances, and a peer's message has
// a bounded size. "" for no salt.
func SaltTag(salt string) string {
	if salt == "" {
		return ""
	}
	sum := sha256.Sum256([]byte("sluice-cache-salt-v1\x00" + salt))
	return hex.EncodeToString(sum[:SaltTagLen/2])
}

// ValidSaltTag says whether tag is one SaltTag returns for a salt: 32
// lowercase hex digits.
func ValidSaltTag(tag string) bool {
	if len(tag) != SaltTagLen {
		return false
	}
	for i := 0; i < len(tag); i++ {
		if c := tag[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// rootOf is the root key of a namespace's chains; the base model's (no
// adapter, no salt) is the root itself.
func (k keyer) rootOf(ns namespace) uint64 {
	if ns == (namespace{}) {
		return k.root
	}
	var d xxhash.Digest
	d.Reset()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], k.root)
	_, _ = d.Write(b[:])
	for _, s := range []string{ns.adapter, ns.salt} {
		binary.LittleEndian.PutUint64(b[:], uint64(len(s))) // length first: no two pairs hash alike
		_, _ = d.Write(b[:])
		_, _ = d.WriteString(s)
	}
	return d.Sum64()
}

// chain is the keying state at an engine block boundary: the last full key
// and the tokens after it that do not yet fill one of our blocks. A dead
// chain is one Sluice cannot key (see Event.Extra): nor any block after.
type chain struct {
	last    uint64
	pending []uint32
	dead    bool
}

func (k keyer) start() chain { return chain{last: k.root} }

// extend feeds tokens after c and returns the keys completed and the new
// state; c is not modified (its pending slice may be shared).
func (k keyer) extend(c chain, tokens []uint32, keys []uint64) ([]uint64, chain) {
	if c.dead {
		return keys, c
	}
	buf := make([]uint32, 0, len(c.pending)+len(tokens))
	buf = append(append(buf, c.pending...), tokens...)
	last := c.last
	for len(buf) >= k.blockSize {
		last = k.key(last, buf[:k.blockSize])
		keys = append(keys, last)
		buf = buf[k.blockSize:]
	}
	var pending []uint32
	if len(buf) > 0 {
		pending = append([]uint32(nil), buf...)
	}
	return keys, chain{last: last, pending: pending}
}

func (k keyer) key(parent uint64, tokens []uint32) uint64 {
	var d xxhash.Digest
	d.Reset()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], parent)
	_, _ = d.Write(b[:])
	var t [4 * 64]byte
	for len(tokens) > 0 {
		n := min(len(tokens), 64)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint32(t[4*i:], tokens[i])
		}
		_, _ = d.Write(t[:4*n])
		tokens = tokens[n:]
	}
	return d.Sum64()
}

// keys returns the keys of every full block of a token sequence of the
// base model.
func (k keyer) keys(tokens []uint32) []uint64 { return k.keysIn(namespace{}, tokens) }

// keysIn returns the keys of every full block of a token sequence in ns.
func (k keyer) keysIn(ns namespace, tokens []uint32) []uint64 {
	out, _ := k.extend(chain{last: k.rootOf(ns)}, tokens, make([]uint64, 0, len(tokens)/k.blockSize))
	return out
}
