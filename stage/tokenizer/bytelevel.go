package tokenizer

// GPT-2's byte-level BPE spells every byte as a printable character so that
// vocabularies and merges stay readable: printable Latin-1 bytes stand for
// themselves, the other 68 bytes map to U+0100 upwards in byte order (so a
// space is "Ġ", U+0120).
var (
	byteToRune [256]rune
	runeToByte = make(map[rune]byte, 256)
)

func init() {
	n := 0
	for b := range 256 {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		r := rune(b)
		if !printable {
			r = rune(256 + n)
			n++
		}
		byteToRune[b] = r
		runeToByte[r] = byte(b)
	}
}

// toByteLevel spells s's bytes in the byte-level alphabet.
func toByteLevel(s string) string {
	out := make([]rune, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = byteToRune[s[i]]
	}
	return string(out)
}

// fromByteLevel maps a token back to bytes. A token with a character
// outside the alphabet (an added token such as "<|im_start|>" is inside
// it, but one in another script is not) stands for its own UTF-8 bytes,
// as in Hugging Face's ByteLevel decoder.
func fromByteLevel(tok string, out []byte) []byte {
	start := len(out)
	for _, r := range tok {
		b, ok := runeToByte[r]
		if !ok {
			return append(out[:start], tok...)
		}
		out = append(out, b)
	}
	return out
}
