/*
 * A test module (built and loaded by TAP tests, never installed): holds a
 * committing transaction after its commit became visible and before the
 * commit callbacks of the modules loaded before it run, while the file
 * named by hold_commit.while_file exists (60 s at most). PostgreSQL calls
 * the callbacks of the module loaded last first, so a session that LOADs
 * this one after the extension's library stops between the two.
 */
#include "postgres.h"

#include <sys/stat.h>

#include "access/xact.h"
#include "fmgr.h"
#include "utils/guc.h"

PG_MODULE_MAGIC;

void _PG_init(void);

static char *while_file = NULL;

static void
hold_at_commit(XactEvent event, void *arg)
{
	struct stat st;
	int			waited_ms = 0;

	if (event != XACT_EVENT_COMMIT || while_file == NULL || while_file[0] == '\0')
		return;
	while (stat(while_file, &st) == 0 && waited_ms < 60000)
	{
		pg_usleep(10000L);
		waited_ms += 10;
	}
}

void
_PG_init(void)
{
	DefineCustomStringVariable("hold_commit.while_file",
							   "Commits wait after becoming visible while this file exists.",
							   NULL, &while_file, "", PGC_USERSET, 0, NULL, NULL, NULL);
	RegisterXactCallback(hold_at_commit, NULL);
}
