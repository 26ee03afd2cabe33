/* chat_template_internal.h — shared by the chat template interpreter's files:
 *   chat_template_parse.c     lexer (jinja2's rules with trim_blocks + lstrip_blocks) and parser
 *   chat_template_value.c     arena, values (Python semantics: truth, ==, <, str(), repr()),
 *                             tojson (json.dumps), JSON -> value
 *   chat_template_eval.c      rendering: statements, expressions, scopes, macros, loops
 *   chat_template_builtins.c  filters, tests, str / dict / list methods, global functions
 * Not for other modules: use chat_template.h.
 *
 * Memory: every node, string and value lives in an arena (one per parsed template, one per
 * render) and is freed with it, so values are plain structs passed by value and shared freely:
 * lists and dicts never change after they are built (the sandbox is immutable); only namespace
 * objects are mutated ({% set ns.x = ... %}). Errors unwind with longjmp to the API entry point,
 * which frees the arena. */
#ifndef KILN_TOKENIZER_CHAT_TEMPLATE_INTERNAL_H
#define KILN_TOKENIZER_CHAT_TEMPLATE_INTERNAL_H
#include "tokenizer/chat_template.h"
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

/* ---- arena ------------------------------------------------------------------------------------ */
typedef struct ct_chunk ct_chunk;
typedef struct ct_arena {
    ct_chunk *head;
    size_t used, cap;  /* in the head chunk */
    size_t total;      /* bytes allocated in all chunks */
    size_t limit;      /* total bytes allowed (0 = none) */
    jmp_buf *oom;      /* where to go when out of memory / over the limit */
    char *oom_msg;     /* message buffer for that case (>= 256 bytes) */
} ct_arena;
void *ct_alloc(ct_arena *a, size_t n);              /* zeroed, 16-byte aligned; longjmp on failure */
char *ct_strndup(ct_arena *a, const char *s, size_t n); /* NUL-terminated copy */
void ct_arena_free(ct_arena *a);

/* ---- values ----------------------------------------------------------------------------------- */
typedef enum {
    CT_UNDEF = 0, CT_NONE, CT_BOOL, CT_INT, CT_FLOAT, CT_STR, CT_LIST, CT_DICT,
    CT_NS,     /* namespace(): a mutable dict of attributes */
    CT_MACRO,  /* a {% macro %} */
    CT_FUNC,   /* a global function: range, namespace, dict, raise_exception, strftime_now, ... */
    CT_METHOD, /* a bound method: "abc".upper, d.items, loop.cycle */
    CT_LOOP    /* the `loop` object of a for loop */
} ct_type;

typedef struct ct_list ct_list;
typedef struct ct_dict ct_dict;
typedef struct ct_loop ct_loop;
struct ct_node;

typedef struct ct_val {
    uint8_t t;     /* ct_type */
    uint8_t tuple; /* CT_LIST: a tuple (prints as (a, b)) */
    uint8_t view;  /* CT_LIST: a dict view (1 items, 2 keys, 3 values: prints as dict_items([...]));
                      CT_UNDEF: 1 when the hint is a whole message ("access to attribute ... is unsafe") */
    uint16_t fn;   /* CT_FUNC / CT_METHOD: the function id */
    union {
        int64_t i;                          /* CT_BOOL, CT_INT */
        double f;                           /* CT_FLOAT */
        struct { const char *p; size_t n; } s; /* CT_STR; CT_UNDEF: the missing name (hint) */
        ct_list *l;                         /* CT_LIST */
        ct_dict *d;                         /* CT_DICT, CT_NS */
        const struct ct_macro *m;           /* CT_MACRO */
        struct ct_val *self;                /* CT_METHOD: the object */
        ct_loop *loop;                      /* CT_LOOP */
    } u;
} ct_val;

struct ct_list {
    size_t n;
    ct_val *v;
};
struct ct_dict {
    size_t n, cap;
    ct_val *k, *v; /* insertion order, as Python dicts */
};

/* constructors */
static inline ct_val ct_undef(const char *hint, size_t n) { ct_val v = {0}; v.t = CT_UNDEF; v.u.s.p = hint; v.u.s.n = n; return v; }
static inline ct_val ct_none(void) { ct_val v = {0}; v.t = CT_NONE; return v; }
static inline ct_val ct_bool(int b) { ct_val v = {0}; v.t = CT_BOOL; v.u.i = b != 0; return v; }
static inline ct_val ct_int(int64_t i) { ct_val v = {0}; v.t = CT_INT; v.u.i = i; return v; }
static inline ct_val ct_float(double f) { ct_val v = {0}; v.t = CT_FLOAT; v.u.f = f; return v; }
static inline ct_val ct_str(const char *p, size_t n) { ct_val v = {0}; v.t = CT_STR; v.u.s.p = p; v.u.s.n = n; return v; }
ct_val ct_list_new(ct_arena *a, size_t n, int tuple); /* n slots, filled by the caller */
ct_val ct_dict_new(ct_arena *a, size_t cap);
/* Sets d[k] = v (replacing an equal key in place, as Python). */
void ct_dict_set(ct_arena *a, ct_dict *d, ct_val k, ct_val v);
/* d[k] or NULL. */
ct_val *ct_dict_get(const ct_dict *d, ct_val k);
ct_val *ct_dict_get_str(const ct_dict *d, const char *k, size_t n);

/* growable string */
typedef struct ct_buf {
    ct_arena *a;
    char *p;
    size_t n, cap;
} ct_buf;
void ct_buf_put(ct_buf *b, const char *s, size_t n);
void ct_buf_putc(ct_buf *b, char c);
void ct_buf_printf(ct_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ct_val ct_buf_val(ct_buf *b); /* the contents as a CT_STR (stays valid) */

/* ---- the renderer's state (also used by value helpers for errors) ------------------------------ */
typedef struct ct_scope ct_scope;
typedef struct ct_ctx {
    ct_arena arena;
    jmp_buf jb;
    char err[1024];
    kiln_status err_status;
    const char *name; /* template name for messages */
    int line;         /* line being evaluated */
    int depth;        /* macro call / expression nesting, bounded */
    ct_scope *globals;
    ct_buf *out;      /* where output goes (macros / set blocks redirect it) */
} ct_ctx;

/* Fails the render: "<name>:<line>: <message>" (status: KILN_ERR_INVALID_ARG for errors in the
 * data or raised by the template, KILN_ERR_UNSUPPORTED for unsupported constructs). */
_Noreturn void ct_fail(ct_ctx *c, kiln_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Python semantics */
const char *ct_type_name(ct_val v);           /* 'str', 'int', 'dict', 'NoneType', 'Undefined', ... */
int ct_truthy(ct_ctx *c, ct_val v);
int ct_equal(ct_val a, ct_val b);             /* == (1 == 1.0 == True; deep for lists / dicts) */
int ct_compare(ct_ctx *c, ct_val a, ct_val b); /* <0, 0, >0 for <; TypeError for unorderable */
void ct_str_of(ct_ctx *c, ct_buf *b, ct_val v);  /* str(v) appended */
void ct_repr_of(ct_ctx *c, ct_buf *b, ct_val v); /* repr(v) appended */
ct_val ct_to_str(ct_ctx *c, ct_val v);        /* str(v) as a value (no copy for strings) */
void ct_float_repr(ct_buf *b, double f);      /* Python repr(float) */
/* json.dumps(v, ensure_ascii, indent (NULL = none; a string or a number of spaces),
 * separators (NULL = default), sort_keys) */
typedef struct ct_json_opts {
    int ensure_ascii, sort_keys;
    const char *indent; /* NULL: one line */
    size_t indent_len;
    const char *item_sep, *key_sep;
    size_t item_sep_len, key_sep_len;
} ct_json_opts;
void ct_tojson(ct_ctx *c, ct_buf *b, ct_val v, const ct_json_opts *o, int level);
ct_val ct_from_json(ct_ctx *c, const json_t *j); /* json.loads result */

/* UTF-8 */
size_t ct_u8_count(const char *s, size_t n);        /* code points */
size_t ct_u8_offset(const char *s, size_t n, size_t cp); /* byte offset of code point index cp (n if past) */
uint32_t ct_u8_dec(const char *s, size_t n, size_t *i); /* decodes at *i, advances */
void ct_u8_enc(ct_buf *b, uint32_t cp);
int ct_is_space(uint32_t cp); /* Python str.isspace() */

/* ---- AST ---------------------------------------------------------------------------------------- */
typedef enum {
    /* statements */
    N_DATA, N_PRINT, N_IF, N_FOR, N_SET, N_SET_BLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_BLOCK /* generation */,
    N_FILTER_BLOCK, N_WITH,
    /* expressions */
    E_CONST, E_NAME, E_NSREF, E_GETATTR, E_GETITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_LIST, E_TUPLE,
    E_DICT, E_BINOP, E_CONCAT, E_COMPARE, E_AND, E_OR, E_NOT, E_NEG, E_POS, E_COND
} ct_kind;

/* E_BINOP / E_COMPARE operators */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct ct_node {
    uint8_t kind, op;
    int line;
    struct ct_node *a, *b, *c; /* operands: object / test / iterable, index / value, ... */
    struct ct_node **list;     /* body / items / positional args / compare operands */
    struct ct_node **list2;    /* else body / kwarg values / macro defaults */
    const char **names;        /* kwarg names / macro parameters / dict: none */
    uint8_t *ops;              /* E_COMPARE: operator per operand */
    int n, n2, nnames;
    const char *name;          /* E_NAME / E_GETATTR / E_NSREF attribute / filter / test / macro */
    size_t name_len;
    const char *ns;            /* E_NSREF: the namespace variable */
    int fid;                   /* E_FILTER / E_TEST: builtin id */
    ct_val cval;               /* E_CONST */
} ct_node;

typedef struct ct_macro {
    const char *name;
    ct_node *node;    /* N_MACRO */
    ct_scope *scope;  /* where it was defined (closure) */
} ct_macro;

struct kiln_chat_template {
    ct_arena arena;
    char *name;
    ct_node **body;
    int n;
    char *errbuf;
};

/* ---- builtins (chat_template_builtins.c) ------------------------------------------------------- */
/* Filter / test ids by name, -1 if unknown. */
int ct_filter_id(const char *name, size_t n);
int ct_test_id(const char *name, size_t n);
/* Global functions: id by name, -1 if none. */
int ct_global_id(const char *name, size_t n);
ct_val ct_global_val(int id);
/* Method id for attribute `name` of v (str / dict / list / loop), -1 if none; *unsafe = 1 for
 * methods the immutable sandbox refuses (list.append, dict.update, ...). */
int ct_method_id(ct_val v, const char *name, size_t n, int *unsafe);

/* A call's arguments, evaluated. */
typedef struct ct_args {
    ct_val *pos;
    int npos;
    const char **kw;
    ct_val *kwv;
    int nkw;
} ct_args;
ct_val ct_call_filter(ct_ctx *c, int id, ct_val v, ct_args *a);
int ct_call_test(ct_ctx *c, int id, ct_val v, ct_args *a);
ct_val ct_call_method(ct_ctx *c, ct_val m, ct_args *a);
ct_val ct_call_global(ct_ctx *c, int id, ct_args *a);

/* chat_template_eval.c, for builtins that call back: map(filter), select(test), loop.cycle */
ct_val ct_list_of(ct_ctx *c, ct_val v); /* list(v): iterates lists, dict keys, string characters */
ct_val ct_getattr(ct_ctx *c, ct_val obj, const char *name, size_t n);
ct_val ct_getitem(ct_ctx *c, ct_val obj, ct_val key);

struct ct_loop {
    ct_list *items;
    size_t index0;
    int depth;
};
#endif
